"""A PyTorch mask_mod(b, h, q_idx, kv_idx) traced once with torch.fx into qkv's text form of a
mask function (docs/api.md: "Mask functions"), with the integer tensors it captures.

Only what qkv's expression form can say is taken: + - * // %, unary -, comparisons, & | ~ on
booleans, abs, torch.where, torch.minimum/maximum (and min/max, clamp), and indexing captured
integer tensors by index expressions. Python control flow on the arguments, .item(), math.* or
any other operation is an error naming it.
"""
import operator

import torch
import torch.fx

_BINARY = {
    operator.add: "+", operator.sub: "-", operator.mul: "*", operator.floordiv: "/",
    operator.mod: "%", operator.eq: "==", operator.ne: "!=", operator.lt: "<", operator.le: "<=",
    operator.gt: ">", operator.ge: ">=", operator.and_: "&&", operator.or_: "||",
    torch.add: "+", torch.sub: "-", torch.mul: "*", torch.floor_divide: "/", torch.remainder: "%",
    torch.eq: "==", torch.ne: "!=", torch.lt: "<", torch.le: "<=", torch.gt: ">", torch.ge: ">=",
    torch.logical_and: "&&", torch.logical_or: "||", torch.bitwise_and: "&&",
    torch.bitwise_or: "||",
}
_BINARY_METHODS = {
    "add": "+", "sub": "-", "mul": "*", "floor_divide": "/", "remainder": "%", "eq": "==",
    "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "logical_and": "&&",
    "logical_or": "||", "bitwise_and": "&&", "bitwise_or": "||", "__and__": "&&", "__or__": "||",
}
_FUNCTIONS = {torch.minimum: "min", torch.maximum: "max", torch.min: "min", torch.max: "max",
              min: "min", max: "max"}
# Conversions between integer types change nothing here (values stay 32-bit).
_SAME = {"long", "int", "to", "clone", "contiguous"}


class MaskTraceError(ValueError):
    pass


def _fail(what):
    raise MaskTraceError(f"create_block_mask: mask_mod {what}")


def _name(target):
    return getattr(target, "__name__", None) or str(target)


def trace(mask_mod):
    """(text, [(name, int32 ndarray)]) for mask_mod."""
    try:
        graph = torch.fx.symbolic_trace(mask_mod)
    except torch.fx.proxy.TraceError as e:
        _fail(f"uses Python control flow (if, while, and, or, not, bool()) on its arguments, "
              f"which tracing cannot follow; write it with torch.where, & and |. ({e})")
    except TypeError as e:
        _fail(f"calls something that cannot take traced tensors (math.*, a list index, ...): {e}")
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 4:
        _fail(f"must take 4 arguments (b, h, q_idx, kv_idx), it takes {len(placeholders)}")
    text = {}  # node → its text
    tensors = []  # (name, int32 array)
    tensor_names = {}  # get_attr node → (name, boolean)
    by_target = {}
    for i, p in enumerate(placeholders):
        text[p] = ("b", "h", "q_idx", "kv_idx")[i]

    def arg(a):
        if isinstance(a, torch.fx.Node):
            if a not in text:
                _fail(f"uses {a.op} {_name(a.target)} where a value was expected")
            return text[a]
        if isinstance(a, bool):
            return "true" if a else "false"
        if isinstance(a, int):
            if not -2**31 <= a < 2**31:
                _fail(f"uses the constant {a}, outside 32 bits")
            return f"({a})"
        _fail(f"uses a {type(a).__name__} constant ({a!r}): qkv's masks hold 32-bit integers "
              "and booleans")

    def lookup(tensor_node, index):
        name, boolean = tensor_names[tensor_node]
        indices = index if isinstance(index, tuple) else (index,)
        element = f"{name}[{', '.join(arg(i) for i in indices)}]"
        return f"({element} != 0)" if boolean else element  # a boolean tensor's elements

    for node in graph.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "get_attr":
            # (torch.fx makes a get_attr node for each use of a captured tensor: one name each.)
            if node.target not in by_target:
                t = getattr(graph, node.target)
                if not torch.is_tensor(t):
                    _fail(f"reads {node.target}, which is not a tensor")
                if t.dtype.is_floating_point or t.dtype.is_complex:
                    _fail(f"reads a captured tensor of {str(t.dtype).replace('torch.', '')}: "
                          "qkv's masks read integer (or boolean) tensors")
                t = t.detach().cpu()
                if t.numel() and (int(t.min()) < -2**31 or int(t.max()) >= 2**31):
                    _fail("reads a captured tensor whose values leave 32 bits")
                name = f"captured{len(tensors)}"
                tensors.append((name, t.to(torch.int32).contiguous().numpy()))
                by_target[node.target] = (name, t.dtype == torch.bool)
            tensor_names[node] = by_target[node.target]
            continue
        if node.op == "output":
            return arg(node.args[0]), tensors
        target, args = node.target, node.args
        if node.op == "call_method":
            if target == "__getitem__" and args[0] in tensor_names:
                text[node] = lookup(args[0], args[1])
            elif target in _BINARY_METHODS and len(args) == 2 and not node.kwargs:
                text[node] = f"({arg(args[0])} {_BINARY_METHODS[target]} {arg(args[1])})"
            elif target in ("abs", "logical_not", "__invert__", "neg") and len(args) == 1:
                op = {"abs": "abs(", "neg": "(-", "logical_not": "(!", "__invert__": "(!"}[target]
                text[node] = f"{op}{arg(args[0])})"
            elif target in _SAME:
                text[node] = arg(args[0])
            else:
                _fail(f"calls .{target}(), which qkv's mask functions cannot express")
            continue
        # call_function
        if target is operator.getitem and args[0] in tensor_names:
            text[node] = lookup(args[0], args[1])
        elif target in _BINARY and len(args) == 2 and not node.kwargs:
            text[node] = f"({arg(args[0])} {_BINARY[target]} {arg(args[1])})"
        elif target in (operator.neg, torch.neg):
            text[node] = f"(-{arg(args[0])})"
        elif target in (operator.invert, torch.logical_not, operator.not_):
            text[node] = f"(!{arg(args[0])})"
        elif target in (operator.abs, torch.abs, abs):
            text[node] = f"abs({arg(args[0])})"
        elif target is torch.where and len(args) == 3:
            text[node] = f"where({arg(args[0])}, {arg(args[1])}, {arg(args[2])})"
        elif target in _FUNCTIONS and len(args) == 2 and not node.kwargs:
            text[node] = f"{_FUNCTIONS[target]}({arg(args[0])}, {arg(args[1])})"
        elif target is torch.clamp:
            x = arg(args[0])
            lo = node.kwargs.get("min", args[1] if len(args) > 1 else None)
            hi = node.kwargs.get("max", args[2] if len(args) > 2 else None)
            if lo is not None:
                x = f"max({x}, {arg(lo)})"
            if hi is not None:
                x = f"min({x}, {arg(hi)})"
            text[node] = x
        elif target is torch.div and node.kwargs.get("rounding_mode") == "floor" and len(args) == 2:
            text[node] = f"({arg(args[0])} / {arg(args[1])})"
        elif target in (operator.truediv, torch.div, torch.true_divide):
            _fail("divides with / (true division, floats); use // (floor division)")
        else:
            _fail(f"calls {_name(target)}, which qkv's mask functions cannot express")
    _fail("returns nothing")
