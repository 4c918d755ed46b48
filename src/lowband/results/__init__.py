"""Results as records: a run's durable essence (:mod:`lowband.results.record`), the
committed store of the records behind every published number (:mod:`lowband.results.store`)
and the checks that tie the results pages to it (:mod:`lowband.results.pages`)."""
