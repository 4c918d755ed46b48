"""FOL's model surgery: architecture descriptors, layer matching, gates, physical pruning.

FOL (Huang & Shu, ICML 2025) fine-tunes each received model, prunes it with an
alignment-aware structured-pruning objective (eq. 5) and fine-tunes it again. Pruned
models have other shapes than anything in the model registry, and in a mixed federation
a received model need not share the receiver's architecture. So FOL works on
**architecture descriptors**: plain nested dicts/lists of ints, floats and strings
(checkpointable with ``torch.load(weights_only=True)``, and JSON-able so that they can
travel in a message's metadata), from which :class:`GraphNet` builds an ``nn.Module``.

Descriptor
    ``{"input_shape": [C, H, W], "ops": [op, ...], "output": i}``. Each op is a dict with
    ``"op"`` (``input``, ``conv``, ``bn``, ``linear``, ``relu``, ``maxpool``, ``gap``
    (global average pool), ``flatten``, ``add``, ``dropout``, ``identity``), ``"in"``
    (indices of its input ops), ``"shape"`` (its output shape without the batch
    dimension) and, for layers with parameters, ``"name"`` (the parameter prefix in the
    native model, e.g. ``"conv1"`` or ``"blocks.0.0"``) and the layer's sizes.
    :func:`trace_arch` derives it from any registry model with ``torch.fx`` (FOL's CIFAR
    and Wildfire CNNs, simplecnn, cnn_cifar, mlp, ResNet-18, ...).

Gates and groups (eq. 5)
    A *prunable group* is a conv/linear layer whose output channels flow, through one
    chain of channel-wise ops (BatchNorm, ReLU, max-pool, global average pool, dropout,
    flatten), into exactly one next conv/linear layer. Its gate ``alpha`` in ``[0, 1]``
    (one per filter/neuron) multiplies the channels at the *gate point*: after the last
    BatchNorm of the chain, else right after the layer. All later ops of the chain are
    positively homogeneous (``relu(a z) = a relu(z)`` for ``a >= 0``), so the gate acts
    as ``alpha_i W_i`` on the filter (and on its BatchNorm's scale and shift), and a gate
    of 0 makes the next layer see exactly zero on that channel. Layers feeding a
    residual addition, several consumers or the output are not prunable (ResNet's
    second conv of a block, the classifier).

Physical removal
    :func:`prune` drops the channels whose gate is below the threshold: the layer's
    output rows (weight, bias), every BatchNorm entry of the chain, and the next layer's
    input columns (``H*W`` columns per channel after a flatten); the kept gates are
    folded into the layer (or its last BatchNorm). The pruned model computes *exactly*
    what the gated model computes with the pruned gates set to zero
    (tests/test_prune.py).

Layer matching (appendix B.1)
    :func:`match_layers`: each layer of the local model (in order) is paired with the
    first not-yet-paired layer of the neighbour model of the same type and parameter
    shape ("first-available"); those pairs are the shared layers, every other neighbour
    layer is unshared.
"""

from __future__ import annotations

import copy
import math
import operator
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import fx, nn

Arch = dict[str, Any]
Params = dict[str, torch.Tensor]

PARAM_OPS = ("conv", "bn", "linear")
#: ops that map channel c to channel c and 0 to 0 for every c (positively homogeneous)
_HOMOGENEOUS = ("relu", "maxpool", "gap", "dropout", "identity")

__all__ = [
    "Arch", "GraphNet", "trace_arch", "to_graph", "to_native", "prune_groups", "match_layers",
    "prune", "count_params", "arch_layers", "shared_cosine", "arch_key", "effective_gates",
]


# --------------------------------------------------------------------------- tracing


def _pair(v: Any) -> list[int]:
    if isinstance(v, (tuple, list)):
        return [int(a) for a in v]
    return [int(v), int(v)]


def _unsupported(what: str) -> ValueError:
    return ValueError(
        f"FOL: cannot describe {what}; FOL's pruning supports models built from Conv2d (groups=1), "
        f"BatchNorm, Linear, ReLU, max-pool, global average pool, flatten, dropout and residual additions")


def _module_op(mod: nn.Module, name: str) -> dict[str, Any]:
    if isinstance(mod, nn.Conv2d):
        if mod.groups != 1 or _pair(mod.dilation) != [1, 1] or mod.padding_mode != "zeros" or isinstance(mod.padding, str):
            raise _unsupported(f"conv {name} (groups/dilation/padding mode)")
        return {"op": "conv", "name": name, "cin": mod.in_channels, "cout": mod.out_channels,
                "k": _pair(mod.kernel_size), "stride": _pair(mod.stride), "pad": _pair(mod.padding),
                "bias": mod.bias is not None}
    if isinstance(mod, (nn.BatchNorm2d, nn.BatchNorm1d)):
        if not (mod.affine and mod.track_running_stats):
            raise _unsupported(f"BatchNorm {name} without affine parameters or running statistics")
        return {"op": "bn", "name": name, "n": mod.num_features, "eps": float(mod.eps),
                "momentum": float(mod.momentum if mod.momentum is not None else 0.1),
                "dims": 2 if isinstance(mod, nn.BatchNorm2d) else 1}
    if isinstance(mod, nn.Linear):
        return {"op": "linear", "name": name, "fin": mod.in_features, "fout": mod.out_features,
                "bias": mod.bias is not None}
    if isinstance(mod, nn.ReLU):
        return {"op": "relu"}
    if isinstance(mod, nn.MaxPool2d):
        if _pair(mod.dilation) != [1, 1] or mod.ceil_mode:
            raise _unsupported(f"max-pool {name} (dilation/ceil_mode)")
        stride = mod.stride if mod.stride is not None else mod.kernel_size
        return {"op": "maxpool", "k": _pair(mod.kernel_size), "stride": _pair(stride), "pad": _pair(mod.padding)}
    if isinstance(mod, nn.AdaptiveAvgPool2d):
        if _pair(mod.output_size) != [1, 1]:
            raise _unsupported(f"adaptive pool {name} to {mod.output_size}")
        return {"op": "gap"}
    if isinstance(mod, (nn.Dropout, nn.Dropout2d)):
        return {"op": "dropout", "p": float(mod.p), "d2": isinstance(mod, nn.Dropout2d)}
    if isinstance(mod, nn.Flatten):
        if mod.start_dim != 1 or mod.end_dim != -1:
            raise _unsupported(f"flatten {name} (start_dim must be 1)")
        return {"op": "flatten"}
    if isinstance(mod, nn.Identity):
        return {"op": "identity"}
    raise _unsupported(f"module {name} ({type(mod).__name__})")


def _arg(node: fx.Node, i: int, key: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(key, default)


def _function_op(node: fx.Node) -> dict[str, Any]:
    t = node.target
    if t in (F.relu, torch.relu):
        return {"op": "relu"}
    if t is F.max_pool2d:
        k = _arg(node, 1, "kernel_size")
        stride = _arg(node, 2, "stride") or k
        if _arg(node, 4, "dilation", 1) not in (1, (1, 1)) or _arg(node, 5, "ceil_mode", False):
            raise _unsupported("max_pool2d with dilation/ceil_mode")
        return {"op": "maxpool", "k": _pair(k), "stride": _pair(stride), "pad": _pair(_arg(node, 3, "padding", 0))}
    if t is F.adaptive_avg_pool2d:
        if _pair(_arg(node, 1, "output_size")) != [1, 1]:
            raise _unsupported("adaptive_avg_pool2d to a size other than 1")
        return {"op": "gap"}
    if t is torch.flatten:
        if _arg(node, 1, "start_dim", 0) != 1 or _arg(node, 2, "end_dim", -1) != -1:
            raise _unsupported("torch.flatten with start_dim != 1")
        return {"op": "flatten"}
    if t in (operator.add, torch.add):
        if len(node.args) != 2 or node.kwargs:
            raise _unsupported("add with extra arguments")
        return {"op": "add"}
    raise _unsupported(f"function {getattr(t, '__name__', t)}")


def _method_op(node: fx.Node) -> dict[str, Any]:
    if node.target == "flatten":
        if _arg(node, 1, "start_dim", 0) != 1 or _arg(node, 2, "end_dim", -1) != -1:
            raise _unsupported("Tensor.flatten with start_dim != 1")
        return {"op": "flatten"}
    if node.target == "relu":
        return {"op": "relu"}
    raise _unsupported(f"tensor method {node.target}")


def trace_arch(model: nn.Module, input_shape: Sequence[int]) -> Arch:
    """The architecture descriptor of ``model`` (see the module docstring)."""
    gm = fx.symbolic_trace(model)
    ops: list[dict[str, Any]] = []
    index: dict[fx.Node, int] = {}
    output: Optional[int] = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if ops:
                raise _unsupported("a model with several inputs")
            op = {"op": "input"}
        elif node.op == "call_module":
            op = _module_op(gm.get_submodule(node.target), str(node.target))
        elif node.op == "call_function":
            op = _function_op(node)
        elif node.op == "call_method":
            op = _method_op(node)
        elif node.op == "output":
            src = node.args[0]
            if not isinstance(src, fx.Node):
                raise _unsupported("a model whose output is not a single tensor")
            output = index[src]
            continue
        else:
            raise _unsupported(f"graph node {node.op} {node.target}")
        inputs = [a for a in node.args if isinstance(a, fx.Node)]
        for a in inputs:
            if a not in index:
                raise _unsupported(f"input {a} of {node}")
        n_in = 2 if op["op"] == "add" else (0 if op["op"] == "input" else 1)
        if len(inputs) != n_in:
            raise _unsupported(f"{node} with {len(inputs)} tensor inputs")
        op["in"] = [index[a] for a in inputs]
        index[node] = len(ops)
        ops.append(op)
    if output is None:
        raise _unsupported("a model without output")
    arch = {"input_shape": [int(s) for s in input_shape], "ops": ops, "output": output}
    _infer_shapes(arch)
    return arch


def _infer_shapes(arch: Arch) -> None:
    """Set each op's ``"shape"`` by running the net on one zero input (in place)."""
    net = GraphNet(arch, check=False)
    net.eval()
    shapes: list[list[int]] = []
    with torch.no_grad():
        net(torch.zeros(1, *arch["input_shape"]), record=shapes)
    for op, shp in zip(arch["ops"], shapes):
        op["shape"] = shp


def arch_key(arch: Arch) -> str:
    """A short stable string identifying the architecture (for caches and equality)."""
    import hashlib
    import json

    return hashlib.blake2b(json.dumps(arch, sort_keys=True).encode(), digest_size=8).hexdigest()


# --------------------------------------------------------------------------- the module


class GraphNet(nn.Module):
    """An ``nn.Module`` built from an architecture descriptor; parameters are named
    ``mods.<op index>.<weight|bias|running_mean|...>``.

    ``forward(x, gates=None)``: ``gates`` maps an op index (a gate point) to a vector of
    per-channel factors applied to that op's output.
    """

    def __init__(self, arch: Arch, check: bool = True) -> None:
        super().__init__()
        self.arch = arch
        mods = {}
        for i, op in enumerate(arch["ops"]):
            kind = op["op"]
            if kind == "conv":
                mods[str(i)] = nn.Conv2d(op["cin"], op["cout"], tuple(op["k"]), stride=tuple(op["stride"]),
                                         padding=tuple(op["pad"]), bias=op["bias"])
            elif kind == "bn":
                cls = nn.BatchNorm2d if op.get("dims", 2) == 2 else nn.BatchNorm1d
                mods[str(i)] = cls(op["n"], eps=op["eps"], momentum=op["momentum"])
            elif kind == "linear":
                mods[str(i)] = nn.Linear(op["fin"], op["fout"], bias=op["bias"])
            elif kind == "dropout":
                mods[str(i)] = (nn.Dropout2d if op.get("d2") else nn.Dropout)(op["p"])
        self.mods = nn.ModuleDict(mods)
        if check and any("shape" not in op for op in arch["ops"]):
            raise ValueError("GraphNet: descriptor without shapes (build it with trace_arch)")

    def forward(self, x: torch.Tensor, gates: Optional[dict[int, torch.Tensor]] = None,
                record: Optional[list] = None) -> torch.Tensor:
        vals: list[Optional[torch.Tensor]] = []
        ops = self.arch["ops"]
        for i, op in enumerate(ops):
            kind = op["op"]
            a = vals[op["in"][0]] if op["in"] else None
            if kind == "input":
                y = x
            elif kind in ("conv", "bn", "linear", "dropout"):
                y = self.mods[str(i)](a)
            elif kind == "relu":
                y = F.relu(a)
            elif kind == "maxpool":
                y = F.max_pool2d(a, op["k"], op["stride"], op["pad"])
            elif kind == "gap":
                y = F.adaptive_avg_pool2d(a, 1)
            elif kind == "flatten":
                y = a.flatten(1)
            elif kind == "add":
                y = a + vals[op["in"][1]]
            elif kind == "identity":
                y = a
            else:  # pragma: no cover - descriptors are validated when traced
                raise ValueError(f"GraphNet: unknown op {kind!r}")
            if gates is not None and i in gates:
                g = gates[i]
                y = y * (g.view(1, -1, 1, 1) if y.dim() == 4 else g.view(1, -1))
            if record is not None:
                record.append([int(s) for s in y.shape[1:]])
            vals.append(y)
        return vals[self.arch["output"]]


# --------------------------------------------------------------------------- naming


def _suffixes(op: dict[str, Any]) -> list[str]:
    if op["op"] == "conv" or op["op"] == "linear":
        return ["weight", "bias"] if op["bias"] else ["weight"]
    if op["op"] == "bn":
        return ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    return []


def to_graph(native: Params, arch: Arch) -> Params:
    """Native (registry model) parameter names -> GraphNet names."""
    out: Params = {}
    used = set()
    for i, op in enumerate(arch["ops"]):
        for s in _suffixes(op):
            key = f"{op['name']}.{s}"
            if key not in native:
                raise KeyError(f"FOL: parameter {key!r} missing from the model's parameters")
            out[f"mods.{i}.{s}"] = native[key]
            used.add(key)
    extra = sorted(set(native) - used)
    if extra:
        raise KeyError(f"FOL: the descriptor does not cover parameters {extra[:3]}")
    return out


def to_native(graph: Params, arch: Arch) -> Params:
    """GraphNet names -> native (registry model) names (inverse of :func:`to_graph`)."""
    return {f"{arch['ops'][int(k.split('.')[1])]['name']}.{k.split('.', 2)[2]}": v for k, v in graph.items()}


# --------------------------------------------------------------------------- structure


def _users(arch: Arch) -> list[list[int]]:
    users: list[list[int]] = [[] for _ in arch["ops"]]
    for i, op in enumerate(arch["ops"]):
        for j in op["in"]:
            users[j].append(i)
    return users


def arch_layers(arch: Arch) -> list[tuple[int, str, tuple[int, ...]]]:
    """The layers with parameters, in order: (op index, type, weight shape)."""
    out = []
    for i, op in enumerate(arch["ops"]):
        if op["op"] == "conv":
            out.append((i, "conv", (op["cout"], op["cin"], *op["k"])))
        elif op["op"] == "linear":
            out.append((i, "linear", (op["fout"], op["fin"])))
        elif op["op"] == "bn":
            out.append((i, "bn", (op["n"],)))
    return out


def prune_groups(arch: Arch) -> list[dict[str, Any]]:
    """The prunable groups (see the module docstring): dicts with ``layer`` (op index of
    the conv/linear whose outputs are gated), ``bns`` (BatchNorms of the chain),
    ``gate`` (op index where the gate applies), ``consumer`` (the next conv/linear) and
    ``per_channel`` (consumer input columns per channel: ``H*W`` after a flatten, else 1)."""
    users = _users(arch)
    ops = arch["ops"]
    groups = []
    for i, op in enumerate(ops):
        if op["op"] not in ("conv", "linear") or i == arch["output"]:
            continue
        bns: list[int] = []
        per_channel = 1
        cur = i
        ok = False
        while True:
            if cur == arch["output"] or len(users[cur]) != 1:
                break
            nxt = users[cur][0]
            kind = ops[nxt]["op"]
            if kind == "bn":
                bns.append(nxt)
            elif kind in _HOMOGENEOUS:
                pass
            elif kind == "flatten":
                shp = ops[cur]["shape"]
                per_channel = math.prod(shp[1:]) if len(shp) > 1 else 1
            elif kind in ("conv", "linear"):
                if kind == "conv" and per_channel != 1:
                    break
                ok = True
                consumer = nxt
                break
            else:
                break
            cur = nxt
        if not ok:
            continue
        # after a BatchNorm only homogeneous ops may follow for the gate to fold exactly
        groups.append({"layer": i, "bns": bns, "gate": bns[-1] if bns else i, "consumer": consumer,
                       "per_channel": per_channel, "channels": op["cout"] if op["op"] == "conv" else op["fout"]})
    return groups


def match_layers(local: Arch, neighbor: Arch) -> list[tuple[int, int]]:
    """Shared layers (appendix B.1): pairs (local op index, neighbour op index) of the same
    type and parameter shape, each local layer taking the first still-free neighbour layer."""
    free = list(arch_layers(neighbor))
    pairs = []
    for li, lt, ls in arch_layers(local):
        for n, (ni, nt, ns) in enumerate(free):
            if nt == lt and ns == ls:
                pairs.append((li, ni))
                del free[n]
                break
    return pairs


def count_params(arch: Arch) -> int:
    """Number of parameters (weights, biases, BatchNorm scale/shift; no buffers)."""
    total = 0
    for op in arch["ops"]:
        if op["op"] == "conv":
            total += op["cout"] * op["cin"] * math.prod(op["k"]) + (op["cout"] if op["bias"] else 0)
        elif op["op"] == "linear":
            total += op["fout"] * op["fin"] + (op["fout"] if op["bias"] else 0)
        elif op["op"] == "bn":
            total += 2 * op["n"]
    return total


def shared_cosine(local: Arch, local_params: Params, other: Arch, other_params: Params) -> float:
    """Cosine similarity (eq. 8) between the parameter vectors of the shared layers
    (weights and biases / BatchNorm scale and shift) of two models; -1 if none match."""
    a, b = [], []
    for li, ni in match_layers(local, other):
        for s in ("weight", "bias"):
            ka, kb = f"mods.{li}.{s}", f"mods.{ni}.{s}"
            if ka in local_params and kb in other_params:
                a.append(local_params[ka].reshape(-1).float())
                b.append(other_params[kb].reshape(-1).float())
    if not a:
        return -1.0
    va, vb = torch.cat(a), torch.cat(b)
    return float(F.cosine_similarity(va, vb, dim=0))


# --------------------------------------------------------------------------- removal


def effective_gates(gates: dict[int, torch.Tensor], threshold: float) -> dict[int, torch.Tensor]:
    """The gates :func:`prune` realises: clipped to [0, 1], those below ``threshold`` set to
    zero, except the largest of a layer whose gates are all below it."""
    out = {}
    for k, a in gates.items():
        a = a.detach().to(torch.float32).clamp(0.0, 1.0)
        keep = a >= threshold
        if not bool(keep.any()):
            keep = torch.zeros_like(keep)
            keep[int(a.argmax())] = True
        out[k] = torch.where(keep, a, torch.zeros_like(a))
    return out


def prune(arch: Arch, params: Params, gates: dict[int, torch.Tensor], threshold: float
          ) -> tuple[Arch, Params, dict[str, Any]]:
    """Physically remove the channels whose gate is below ``threshold`` and fold the other
    gates into the weights. ``gates`` maps a group's gate op index to its gate vector
    (groups without an entry keep every channel with factor 1). Each group keeps at least
    its largest-gate channel. Returns the new descriptor, its parameters and a report
    (``kept``/``channels`` per group, parameter counts before and after)."""
    new_arch = copy.deepcopy(arch)
    new = {k: v.detach().clone() for k, v in params.items()}
    ops = new_arch["ops"]
    report: dict[str, Any] = {"groups": {}, "params_before": count_params(arch)}
    for g in prune_groups(arch):
        alpha = gates.get(g["gate"])
        if alpha is None:
            continue
        alpha = alpha.detach().to(torch.float32).clamp(0.0, 1.0)
        keep = alpha >= threshold
        if not bool(keep.any()):
            keep = torch.zeros_like(keep)
            keep[int(alpha.argmax())] = True
        idx = torch.nonzero(keep).flatten()
        a = alpha[idx]
        li, ci = g["layer"], g["consumer"]
        # fold the kept gates: into the last BatchNorm of the chain, else into the layer
        if g["bns"]:
            b = g["bns"][-1]
            new[f"mods.{b}.weight"] = new[f"mods.{b}.weight"][idx] * a
            new[f"mods.{b}.bias"] = new[f"mods.{b}.bias"][idx] * a
            for s in ("running_mean", "running_var"):
                new[f"mods.{b}.{s}"] = new[f"mods.{b}.{s}"][idx]
        else:
            shape = (-1,) + (1,) * (new[f"mods.{li}.weight"].dim() - 1)
            new[f"mods.{li}.weight"] = new[f"mods.{li}.weight"][idx] * a.view(shape)
            if f"mods.{li}.bias" in new:
                new[f"mods.{li}.bias"] = new[f"mods.{li}.bias"][idx] * a
        if g["bns"]:
            new[f"mods.{li}.weight"] = new[f"mods.{li}.weight"][idx]
            if f"mods.{li}.bias" in new:
                new[f"mods.{li}.bias"] = new[f"mods.{li}.bias"][idx]
        for b in g["bns"][:-1]:
            for s in ("weight", "bias", "running_mean", "running_var"):
                new[f"mods.{b}.{s}"] = new[f"mods.{b}.{s}"][idx]
        for b in g["bns"]:
            ops[b]["n"] = int(idx.numel())
        # the consumer's input columns
        w = new[f"mods.{ci}.weight"]
        pc = g["per_channel"]
        cols = (idx[:, None] * pc + torch.arange(pc, device=idx.device)[None, :]).flatten() if pc > 1 else idx
        new[f"mods.{ci}.weight"] = w[:, cols]
        if ops[li]["op"] == "conv":
            ops[li]["cout"] = int(idx.numel())
        else:
            ops[li]["fout"] = int(idx.numel())
        if ops[ci]["op"] == "conv":
            ops[ci]["cin"] = int(idx.numel())
        else:
            ops[ci]["fin"] = int(idx.numel()) * pc
        report["groups"][str(li)] = {"kept": int(idx.numel()), "channels": int(g["channels"])}
    _infer_shapes(new_arch)
    new = {k: v.contiguous() for k, v in new.items()}
    report["params_after"] = count_params(new_arch)
    return new_arch, new, report
