"""A PyTorch mask_mod(b, h, q_idx, kv_idx) or score_mod(score, b, h, q_idx, kv_idx) traced once
with torch.fx into qkv's text form (docs/api.md: "Mask functions", "Score functions"), with the
tensors it captures.

Only what qkv's expression form can say is taken: + - * // %, unary -, comparisons, & | ~ on
booleans, abs, torch.where, torch.minimum/maximum (and min/max, clamp, clip; each in its method
form too: x.clamp(lo, hi), x.where(c, y), x.minimum(y)), and indexing captured
tensors by index expressions; in a score function also floats: / (true division), float
constants, exp, log, tanh, sigmoid, sqrt, and captured float tensors. Python control flow on the
arguments, .item(), math.* or any other operation is an error naming it.
"""
import inspect
import math
import operator
import types

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
    "__add__": "+", "__sub__": "-", "__mul__": "*", "__floordiv__": "/", "__mod__": "%",
}
# The method forms of clamp: where each takes its lower and upper bound (None: it has none).
_CLAMP_METHODS = {"clamp": (1, 2), "clip": (1, 2), "clamp_min": (1, None), "clamp_max": (None, 1)}
_FUNCTIONS = {torch.minimum: "min", torch.maximum: "max", torch.min: "min", torch.max: "max",
              min: "min", max: "max"}
# Functions of one float (score functions).
_REAL_FUNCTIONS = {torch.exp: "exp", torch.log: "log", torch.tanh: "tanh",
                   torch.sigmoid: "sigmoid", torch.sqrt: "sqrt"}
_REAL_METHODS = {"exp": "exp", "log": "log", "tanh": "tanh", "sigmoid": "sigmoid", "sqrt": "sqrt"}
for _f in ("exp", "log", "tanh", "sqrt"):
    _REAL_FUNCTIONS[getattr(math, _f)] = _f  # (math.* on a traced value fails before here)
_REAL_FUNCTIONS[torch.nn.functional.sigmoid] = "sigmoid"
_REAL_FUNCTIONS[torch.nn.functional.tanh] = "tanh"
# Conversions between integer types change nothing here (values stay 32-bit).
_SAME = {"long", "int", "to", "clone", "contiguous"}
_TO_FLOAT = {"float", "double", "half", "bfloat16"}


class MaskTraceError(ValueError):
    pass


class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer, with captured nn.Parameters (a learnable bias in a score_mod) taken as
    the tensors they are, by reference, as fx takes other captured tensors."""

    def create_arg(self, a):
        if isinstance(a, torch.nn.Parameter):
            for name, p in self.root.named_parameters():
                if p is a:
                    return self.create_node("get_attr", name, (), {})
            name = f"_qkv_parameter{len(list(self.root.parameters()))}"
            self.root.register_parameter(name, a)
            return self.create_node("get_attr", name, (), {})
        return super().create_arg(a)


def _name(target):
    return getattr(target, "__name__", None) or str(target)


def _float_text(x):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "(-inf)"
    t = repr(float(x))
    return f"({t})" if x < 0 else t


def _failure(score):
    """fail(what): raises MaskTraceError naming the function traced."""
    who = "flex_attention: score_mod" if score else "create_block_mask: mask_mod"

    def fail(what):
        raise MaskTraceError(f"{who} {what}")
    return fail


def _int32(t, fail):
    """A captured integer tensor's values as a contiguous int32 ndarray."""
    c = t.detach().cpu()
    if c.numel() and (int(c.min()) < -2**31 or int(c.max()) >= 2**31):
        fail("reads a captured tensor whose values leave 32 bits")
    return c.to(torch.int32).contiguous().numpy()


def _depends_on(fn, depth=2):
    """What a plain function's trace depends on besides its code: the objects its closure cells,
    its defaults and the globals it names hold, and one level inside them (a module's
    attributes and parameters, an object's attributes, a list's, tuple's or dict's items, and
    what a helper function it calls depends on); None for other callables."""
    if not inspect.isfunction(fn):
        return None
    held = []
    for c in fn.__closure__ or ():
        try:
            held.append(c.cell_contents)
        except ValueError:  # (an empty cell)
            held.append(None)
    held += [fn.__globals__[n] for n in fn.__code__.co_names if n in fn.__globals__]
    inside = []
    for x in held:
        if isinstance(x, torch.nn.Module):
            inside.append(tuple(vars(x).values()) + tuple(x.parameters()) + tuple(x.buffers()))
        elif isinstance(x, (list, tuple)):
            inside.append(tuple(x))
        elif isinstance(x, dict):
            inside.append(tuple(x.keys()) + tuple(x.values()))
        elif isinstance(x, types.FunctionType):
            inside.append(_depends_on(x, depth - 1) if depth > 1 else None)
        elif hasattr(x, "__dict__") and not isinstance(x, (type, types.ModuleType)):
            inside.append(tuple(vars(x).values()))
    return (fn.__code__, tuple(held), fn.__defaults__,
            tuple(sorted((fn.__kwdefaults__ or {}).items())), tuple(inside))


def _objects(x):
    """The objects in what _depends_on returned (tuples opened)."""
    if isinstance(x, tuple):
        for y in x:
            yield from _objects(y)
    else:
        yield x


def trace_once(fn, score=False):
    """trace(fn, score), kept on the function and traced again only when its code, closure,
    defaults, the globals it names or what lies one level inside them are other objects than
    at its last trace (compared by identity). A trace is kept only when every tensor it
    captured is one of those objects: a tensor the function derives from them (bias.float(),
    slopes.exp()) is computed while tracing, so such a function is traced at each call. The
    values of the tensors kept are read again at each call (integer ones here, float ones by
    the caller). Other callables (bound methods, partials) are traced at each call."""
    depends = _depends_on(fn)
    cached = getattr(fn, "_qkv_trace", None) if depends is not None else None
    if cached is not None and _same(cached[0], depends):
        text, ints, floats = cached[1]
        fresh = [(name, _int32(src, _failure(score))) for (name, _), src in zip(ints, cached[2])]
        return text, fresh, floats
    sources = []
    result = trace(fn, score, sources)
    if depends is not None:
        roots = {id(x) for x in _objects(depends)}
        captured = sources + [t for _, t in result[2]]
        if all(id(t) in roots for t in captured):
            fn._qkv_trace = (depends, result, sources)  # (lives and dies with the function)
    return result


def _same(x, y):
    """x and y are the same objects (tuples element by element)."""
    if isinstance(x, tuple) and isinstance(y, tuple):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    return x is y


def trace(fn, score=False, int_sources=None):
    """(text, int tensors [(name, int32 ndarray)], float tensors [(name, tensor)]) for a mask_mod,
    or with score=True a score_mod. int_sources, when given, receives the captured integer
    tensors themselves, in the order of the second list."""
    fail = _failure(score)
    if not inspect.isfunction(fn):  # a bound method, a functools.partial, a callable object
        f = fn
        if score:
            def fn(score, b, h, q_idx, kv_idx):
                return f(score, b, h, q_idx, kv_idx)
        else:
            def fn(b, h, q_idx, kv_idx):
                return f(b, h, q_idx, kv_idx)
    try:
        tracer = _Tracer()
        traced = tracer.trace(fn)
        graph = torch.fx.GraphModule(tracer.root, traced)
    except torch.fx.proxy.TraceError as e:
        fail(f"uses Python control flow (if, while, and, or, not, bool()) on its arguments, "
             f"which tracing cannot follow; write it with torch.where, & and |. ({e})")
    except TypeError as e:
        fail(f"calls something that cannot take traced tensors (math.*, a list index, ...): {e}")
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    names = ("score", "b", "h", "q_idx", "kv_idx") if score else ("b", "h", "q_idx", "kv_idx")
    if len(placeholders) != len(names):
        fail(f"must take {len(names)} arguments ({', '.join(names)}), it takes "
             f"{len(placeholders)}")
    text = {}  # node → its text
    kind = {}  # node → "i" (integer), "b" (boolean) or "f" (float)
    ints, floats = [], []  # captured tensors
    tensor_names = {}  # get_attr node → (name, kind of its elements)
    by_target = {}
    for i, p in enumerate(placeholders):
        text[p] = names[i]
        kind[p] = "f" if names[i] == "score" else "i"

    def arg(a):
        """(text, kind) of an argument."""
        if isinstance(a, torch.fx.Node):
            if a in tensor_names and tensor_names[a][3] == 0:  # a 0-dim tensor: its value
                name, element_kind = tensor_names[a][:2]
                return (f"({name}[0] != 0)" if element_kind == "b" else f"{name}[0]"), \
                    ("b" if element_kind == "b" else element_kind)
            if a not in text:
                fail(f"uses {a.op} {_name(a.target)} where a value was expected")
            return text[a], kind[a]
        if isinstance(a, bool):
            return ("true" if a else "false"), "b"
        if isinstance(a, int):
            if not -2**31 <= a < 2**31:
                fail(f"uses the constant {a}, outside 32 bits")
            return f"({a})", "i"
        if isinstance(a, float) and score:
            return _float_text(a), "f"
        fail(f"uses a {type(a).__name__} constant ({a!r}): qkv's masks hold 32-bit integers "
             "and booleans" + ("" if score else " (floats are for score_mod)"))

    def numbers(*kinds):
        return "f" if "f" in kinds else "i"

    def lookup(node, tensor_node, index):
        """An element (text, kind) of a captured tensor, or None when `node` indexes fewer dims
        than it has (t[h][d]: node is recorded as a tensor with its first indices)."""
        name, element_kind, prefix, ndim = tensor_names[tensor_node]
        indices = index if isinstance(index, tuple) else (index,)
        pieces = list(prefix)
        for i in indices:
            t, k = arg(i)
            if k == "f":
                fail(f"indexes {name} with a float")
            pieces.append(t)
        if len(pieces) < max(ndim, 1):
            tensor_names[node] = (name, element_kind, tuple(pieces), ndim)
            return None
        element = f"{name}[{', '.join(pieces)}]"
        if element_kind == "b":  # a boolean tensor's elements
            return f"({element} != 0)", "b"
        return element, element_kind

    def index_into(node, tensor_node, index):
        found = lookup(node, tensor_node, index)
        if found is not None:
            text[node], kind[node] = found

    def binary(op, a, b):
        (x, kx), (y, ky) = arg(a), arg(b)
        if op in ("==", "!=", "<", "<=", ">", ">="):
            return f"({x} {op} {y})", "b"
        if op in ("&&", "||"):
            return f"({x} {op} {y})", "b"
        if op in ("/", "%") and "f" in (kx, ky):  # (qkv's / of floats divides truly)
            fail(f"takes {'//' if op == '/' else '%'} of a float, which qkv's score functions "
                 "cannot express")
        return f"({x} {op} {y})", numbers(kx, ky)

    def where(c, a, b):
        (x, kx), (y, ky) = arg(a), arg(b)
        return f"where({arg(c)[0]}, {x}, {y})", "b" if kx == ky == "b" else numbers(kx, ky)

    def clamp(a, lo, hi):
        x, k = arg(a)
        if lo is not None:
            t, kl = arg(lo)
            x, k = f"max({x}, {t})", numbers(k, kl)
        if hi is not None:
            t, kh = arg(hi)
            x, k = f"min({x}, {t})", numbers(k, kh)
        return x, k

    def true_division(a, b):
        (x, kx), (y, ky) = arg(a), arg(b)
        if not score:
            fail("divides with / (true division, floats); use // (floor division)")
        return f"(float({x}) / {y})", "f"

    for node in graph.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "get_attr":
            # (torch.fx makes a get_attr node for each use of a captured tensor: one name each.)
            if node.target not in by_target:
                t = getattr(graph, node.target)
                if not torch.is_tensor(t):
                    fail(f"reads {node.target}, which is not a tensor")
                if t.dtype.is_complex:
                    fail(f"reads a captured tensor of {str(t.dtype).replace('torch.', '')}")
                if t.dtype.is_floating_point:
                    if not score:
                        fail(f"reads a captured tensor of {str(t.dtype).replace('torch.', '')}: "
                             "qkv's masks read integer (or boolean) tensors")
                    name = f"param{len(floats)}"
                    floats.append((name, t))
                    by_target[node.target] = (name, "f", (), t.dim())
                else:
                    name = f"captured{len(ints)}"
                    ints.append((name, _int32(t, fail)))
                    if int_sources is not None:
                        int_sources.append(t)
                    by_target[node.target] = (name, "b" if t.dtype == torch.bool else "i", (),
                                              t.dim())
            tensor_names[node] = by_target[node.target]
            continue
        if node.op == "output":
            out, k = arg(node.args[0])
            if score and k == "b":
                fail("returns a boolean: a score_mod returns the score (a mask goes in block_mask)")
            return out, ints, floats
        target, args = node.target, node.args
        if node.op == "call_method":
            if target == "__getitem__" and args[0] in tensor_names:
                index_into(node, args[0], args[1])
            elif target in _CLAMP_METHODS:  # x.clamp(lo, hi), x.clip(…), x.clamp_min(lo), …
                def bound(at, name):
                    if at is None:
                        return None
                    return node.kwargs.get(name, args[at] if len(args) > at else None)
                lo_at, hi_at = _CLAMP_METHODS[target]
                text[node], kind[node] = clamp(args[0], bound(lo_at, "min"), bound(hi_at, "max"))
            elif target in ("minimum", "maximum", "min", "max") and len(args) == 2 and \
                    not node.kwargs:  # x.minimum(y), x.min(y): as torch.minimum(x, y)
                (x, kx), (y, ky) = arg(args[0]), arg(args[1])
                text[node], kind[node] = f"{target[:3]}({x}, {y})", numbers(kx, ky)
            elif target == "where" and len(args) == 3:  # x.where(c, y): torch.where(c, x, y)
                text[node], kind[node] = where(args[1], args[0], args[2])
            elif target == "div" and node.kwargs.get("rounding_mode") == "floor" and \
                    len(args) == 2:
                text[node], kind[node] = binary("/", args[0], args[1])
            elif target in _BINARY_METHODS and len(args) == 2 and not node.kwargs:
                text[node], kind[node] = binary(_BINARY_METHODS[target], args[0], args[1])
            elif target in ("div", "true_divide", "__truediv__") and len(args) == 2 and \
                    node.kwargs.get("rounding_mode") is None:
                text[node], kind[node] = true_division(args[0], args[1])
            elif target in ("abs", "neg", "__neg__") and len(args) == 1:
                x, k = arg(args[0])
                text[node] = f"abs({x})" if target == "abs" else f"(-{x})"
                kind[node] = k
            elif target in ("logical_not", "__invert__") and len(args) == 1:
                text[node], kind[node] = f"(!{arg(args[0])[0]})", "b"
            elif target in _REAL_METHODS and score and len(args) == 1:
                text[node], kind[node] = f"{_REAL_METHODS[target]}({arg(args[0])[0]})", "f"
            elif target in _TO_FLOAT and score:
                text[node], kind[node] = f"float({arg(args[0])[0]})", "f"
            elif target in _SAME:
                x, k = arg(args[0])
                dtype = args[1] if len(args) > 1 else node.kwargs.get("dtype")
                to_float = isinstance(dtype, torch.dtype) and dtype.is_floating_point
                if to_float and score:
                    text[node], kind[node] = f"float({x})", "f"
                elif k == "f" and (target in ("long", "int") or
                                   (isinstance(dtype, torch.dtype) and not dtype.is_floating_point)):
                    fail(f"converts a float to an integer (.{target}()), which qkv's score "
                         "functions cannot express")
                else:
                    text[node], kind[node] = x, k
            else:
                fail(f"calls .{target}(), which qkv's {'score' if score else 'mask'} functions "
                     "cannot express")
            continue
        # call_function
        if target is operator.getitem and args[0] in tensor_names:
            index_into(node, args[0], args[1])
        elif target in _BINARY and len(args) == 2 and not node.kwargs:
            text[node], kind[node] = binary(_BINARY[target], args[0], args[1])
        elif target in (operator.neg, torch.neg):
            x, k = arg(args[0])
            text[node], kind[node] = f"(-{x})", k
        elif target in (operator.invert, torch.logical_not, operator.not_):
            text[node], kind[node] = f"(!{arg(args[0])[0]})", "b"
        elif target in (operator.abs, torch.abs, abs):
            x, k = arg(args[0])
            text[node], kind[node] = f"abs({x})", k
        elif target is torch.where and len(args) == 3:
            text[node], kind[node] = where(args[0], args[1], args[2])
        elif target in _FUNCTIONS and len(args) == 2 and not node.kwargs:
            (x, kx), (y, ky) = arg(args[0]), arg(args[1])
            text[node], kind[node] = f"{_FUNCTIONS[target]}({x}, {y})", numbers(kx, ky)
        elif target in (torch.clamp, torch.clip):
            text[node], kind[node] = clamp(
                args[0], node.kwargs.get("min", args[1] if len(args) > 1 else None),
                node.kwargs.get("max", args[2] if len(args) > 2 else None))
        elif target is torch.div and node.kwargs.get("rounding_mode") == "floor" and len(args) == 2:
            text[node], kind[node] = binary("/", args[0], args[1])
        elif target in (operator.truediv, torch.div, torch.true_divide) and len(args) == 2 and \
                node.kwargs.get("rounding_mode") is None:
            text[node], kind[node] = true_division(args[0], args[1])
        elif target in _REAL_FUNCTIONS and score and len(args) == 1:
            text[node], kind[node] = f"{_REAL_FUNCTIONS[target]}({arg(args[0])[0]})", "f"
        else:
            fail(f"calls {_name(target)}, which qkv's {'score' if score else 'mask'} functions "
                 "cannot express")
    fail("returns nothing")
