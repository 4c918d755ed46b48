"""lowband's version, in a module of its own so that code below the package's front door
(the run record) can name it without importing the API."""

__version__ = "0.1.0"
