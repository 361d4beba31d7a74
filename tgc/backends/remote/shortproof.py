"""Proofs that an LLVM IR kernel a CPU server compiled is short and safe to run inline in the server's own process.

A CPU kernel runs as native code: in a launch worker (`launcher`) the server can kill it at a deadline, and a
fault loses the worker, not the server. Inline (in the request thread) it saves the worker's round trip, but then
nothing can stop it and a fault kills the server. So `prove_short(src, contract)` accepts only kernels it can
prove, for every launch that meets `contract`, to terminate within `MAX_WORK` weighted instructions per thread and
to touch only the bytes of their own buffers, with no undefined behaviour that could let the compiler do anything
else. It returns the work bound, or None (the launch goes to a worker, as before) when any part is not certain.

The text proven is LLVM's, not the client's: the source parsed, given the server's triple and data layout and
verified, exactly as the compile does it, then printed back (`str(module)`, `LLVMCompiler.compile_printed`: the
server's compile worker returns the object and the print of the very module it compiled; `prove_short` without a
print parses here, `LLVMCompiler.printed`). In that print every instruction is on a line of its own, in LLVM's
spelling (`align` written out, constants folded as LLVM folded them, numbered values `%0`), names that need quotes
are quoted, and the only comments are LLVM's own (`; preds = ...`, `; Function Attrs: ...`): a source's line
breaks, blanks, comments and constant expressions LLVM folds cannot show the proof one kernel and the compile
another (reviews 13-15 found such holes in a proof of the client's text). Text LLVM refuses is not proven. The
lexical checks kept from then (the client's text only tab, line feed and printable ASCII; each body line lexed
as LLVM does, one opcode word, no constant expression, no global but an intrinsic callee, integers at most 64 bits,
vectors at most `MAX_LANES` lanes) still run, on the print, as a second line of defence.

What it accepts (anything else: None):
- outside the function only LLVM's header lines (`; ModuleID`, `source_filename`, `target datalayout/triple`: the
  server's, set by the compile), `declare`s of whitelisted pure `llvm.*` math intrinsics whose attribute group holds
  only the attributes LLVM gives those, and attribute groups (`attributes #N = { ... }`).
- one `define void @f(ptr ... %p0, ..., i32 %core_id) #N`: pointer parameters (alignment at most 64, the arena's),
  then only `core_id` (no dimension variables); its attribute group only `nounwind`, `"prefer-vector-width"`,
  `"no-trapping-math"`.
- control flow: forward unconditional branches, and loops of the form the renderer writes: a header block holding
  `%r = phi i32 [C0, %pre], [%n, %latch]`, `%c = icmp slt|ult i32 %r, C1`, `br i1 %c, label %body, label %exit`
  (body right after the header, exit after the body), one back edge `br label %header` from the latch, whose
  `%n = add i32 %r, S` (S >= 1, constant). Blocks between header and exit are entered only from the header and
  branch only among themselves or back to the header, so loops nest and end; `%r` is used only inside its loop.
- integers get intervals (constants, `core_id` in [0, global_size), loop counters, +, -, *, shifts, and, or, ...;
  anything that may wrap, or a loaded value, is unknown). Every load and store goes through an alloca of exactly
  its type (allocas in the entry block, scalar or vector) or a `getelementptr` of a pointer parameter with one
  index whose interval keeps the access inside that buffer's contract size, aligned no more than its address is
  known to be. Indices that may be poison (from a load, a fast-math flag, a wrapping flagged op) are refused.
  Integer division only by a constant other than 0 and -1. Pointers are used only as those bases and addresses.
- size: at most `MAX_LINES` lines in the function, `MAX_LANES` lanes a vector, `MAX_STACK` bytes of allocas (the
  kernel's stack frame stays small in the server's thread); no metadata, quoted names, call-site attribute groups
  or comments (but LLVM's on a block's label) in its body.

The proof rests on the source the server compiled itself (a client cannot send a binary of its own) and on the
launch meeting the contract; the server also runs inline only launches whose buffers are distinct and 64-byte
aligned (the parameters are `noalias`).
"""

from __future__ import annotations

import re

from tgc.backends.remote.contract import Contract

MAX_WORK = 1 << 20  # weighted instructions (vector lanes counted) per launch, all threads together
MAX_LINES = 1500  # lines of a function proven (its stack frame, and the proof's own time, stay small)
MAX_LANES = 64  # lanes of a vector type
MAX_STACK = 64 << 10  # bytes of allocas

_NAME = r"%[\w.$-]+"
_SCALAR = r"(?:i(?:1|8|16|32|64)|half|bfloat|float|double)"  # (wider integers: see `_one_instruction`)
_TYPE = rf"(?:{_SCALAR}|<\d+ x {_SCALAR}>)"
_INTRINSICS = {"maxnum", "minnum", "maximum", "minimum", "trunc", "floor", "ceil", "round", "rint", "nearbyint",
               "sqrt", "fabs", "exp", "exp2", "log", "log2", "sin", "cos", "fma", "fmuladd", "copysign", "pow",
               "smax", "smin", "umax", "umin"}  # (integer max/min: no trap, no poison of their own; results unknown)
# attribute groups (`attributes #N = { ... }`, LLVM's spelling): the kernel's may hold only these; an intrinsic's
# declaration only the attributes LLVM gives the pure math intrinsics above (a source could add one such as
# `noreturn` to a declaration, and LLVM would then drop whatever follows a call of it)
# (the vector widths a renderer writes: review 16 found any digits accepted)
_KERNEL_ATTRS = re.compile(r'nounwind|"prefer-vector-width"="(?:64|128|256|512)"|"no-trapping-math"="true"')
_INTRINSIC_ATTRS = frozenset({"nocallback", "nocreateundeforpoison", "nofree", "nosync", "nounwind", "speculatable",
                              "willreturn", "memory(none)"})
_ATTR_GROUP = re.compile(r"^attributes #(\d+) = \{ (.*) \}$")
_ATTR = re.compile(r'"[\w.-]*"="[\w.-]*"|[\w()]+')
_DECLARE = re.compile(rf"^declare {_TYPE} @llvm\.(\w+)\.[\w.]+\(({_TYPE}(?:, {_TYPE})*)\)(?: #(\d+))?$")
_DEFINE = re.compile(r"^define void @([A-Za-z][A-Za-z0-9_]*)\((.*)\) #(\d+) \{$")
# the other lines LLVM prints outside a function: its comments (`; ModuleID = '<string>'`, `; Function Attrs: ...`)
# and the module's name, data layout and triple (those two set by the compile over whatever the source said)
_HEADER = re.compile(r"""^(?:; ModuleID = '[^'\\]*'|; Function Attrs: [\w() "=.-]*|source_filename = "[^"\\]*"|"""
                     r"""target (?:datalayout|triple) = "[^"\\]*")$""")
# a block's label as LLVM prints it: its name, and a comment of its predecessors
_LABEL = re.compile(r"^([\w.$-]+):(?: +; (?:preds = %[\w.$-]+(?:, %[\w.$-]+)*|No predecessors!))?$")
_PARAM = re.compile(rf"^ptr(?: noalias)?(?: align (\d+))? ({_NAME})$")
# an intrinsic call's argument: a type and a value, no attribute (`noundef` makes a poison argument undefined
# behaviour, and LLVM then deletes the code around the call; `nofpclass(nan)` the same for a NaN)
_LITERAL = r"[-+]?[0-9][\w.+-]*"
_ARG = re.compile(rf"{_TYPE} (?:{_NAME}|{_LITERAL}|true|false|zeroinitializer|poison|undef"
                  rf"|splat \({_SCALAR} {_LITERAL}\)|<{_SCALAR} {_LITERAL}(?:, {_SCALAR} {_LITERAL})*>)")
_FLAGS = {"nuw", "nsw", "exact", "disjoint", "nneg", "nnan", "ninf", "nsz", "arcp", "contract", "afn", "reassoc",
          "fast", "inbounds"}
# every LLVM instruction opcode, and the words that start a constant expression or an inline asm: LLVM IR does not
# end an instruction at a line break, so a line could carry a second instruction (or an operand could be a constant
# expression such as `inttoptr (i64 4096 to ptr)`) that the patterns below, reading one instruction a line, never
# see (review 13: a hidden store to an address of the client's choosing, a hidden call); a line holds exactly one
# (the proof now reads LLVM's print, one instruction a line by construction: this stays as a second check, and still
# refuses constant expressions LLVM keeps)
_OPCODES = frozenset("""ret br switch indirectbr invoke resume unreachable cleanupret catchret catchswitch callbr fneg
    add fadd sub fsub mul fmul udiv sdiv fdiv urem srem frem shl lshr ashr and or xor extractelement insertelement
    shufflevector extractvalue insertvalue alloca load store fence cmpxchg atomicrmw getelementptr trunc zext sext
    fptrunc fpext fptoui fptosi uitofp sitofp ptrtoint ptrtoaddr inttoptr bitcast addrspacecast icmp fcmp phi select
    freeze call va_arg landingpad catchpad cleanuppad tail musttail notail blockaddress dso_local_equivalent no_cfi asm
    sideeffect""".split())
_INT_OPS = {"add", "sub", "mul", "shl", "lshr", "ashr", "and", "or", "xor", "sdiv", "udiv", "srem", "urem"}
_FLOAT_OPS = {"fadd", "fsub", "fmul", "fdiv", "frem"}
_CASTS = {"bitcast", "sext", "zext", "trunc", "sitofp", "uitofp", "fptosi", "fptoui", "fpext", "fptrunc"}


class _No(Exception):
    """Not provable: the launch goes to a worker."""


def _split(text: str) -> list[str]:
    """`text` split at its top-level commas (not inside <>, [], (), {})."""
    out, depth, cur = [], 0, 0
    for i, c in enumerate(text):
        if c in "<[({":
            depth += 1
        elif c in ">])}":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(text[cur:i].strip())
            cur = i + 1
    out.append(text[cur:].strip())
    return out


def _size(ty: str) -> int:
    """Bytes of a scalar or vector type in memory (i1 elements refused). Only types whose packed size is a power of
    two are accepted: LLVM steps a `getelementptr` (and lays out an alloca) by the type's alloc size, the packed size
    rounded up to its alignment (`<3 x float>`: 12 bytes stored, a 16-byte stride; `i24`: 3 and 4), so for any other
    type the bytes a load or store touches and the stride between elements differ, and the bounds would not hold."""
    m = re.fullmatch(rf"<(\d+) x ({_SCALAR})>", ty)
    n, s = (int(m.group(1)), m.group(2)) if m else (1, ty)
    bits = {"half": 16, "bfloat": 16, "float": 32, "double": 64}.get(s) or int(s[1:])
    if bits % 8 or not 1 <= n <= MAX_LANES or bits > 64:
        raise _No
    size = n * bits // 8
    if size & (size - 1):
        raise _No
    return size


def _abi_align(ty: str) -> int:
    return 1 << (_size(ty) - 1).bit_length()


def _lanes(ty: str) -> int:
    m = re.match(r"<(\d+) x", ty)
    return int(m.group(1)) if m else 1


def _pow2_part(n: int) -> int:
    return min(64, n & -n)


def prove_short(src: str, contract: Contract, printed: str | None = None) -> int | None:
    """The work bound (weighted instructions of one launch, all threads) when kernel `src` (LLVM IR) provably ends
    within `MAX_WORK` and stays inside its buffers for every launch meeting `contract`; else None. The proof reads
    `printed`, LLVM's print of the module compiled from `src` (`LLVMCompiler.compile_printed`: the server has it
    from its compile worker), by default `src` parsed and verified here as the compile parses it
    (`LLVMCompiler.printed`); text LLVM refuses is not proven. The client's own text must also be plain (tab, line
    feed, printable ASCII), a check of the source as sent kept besides the proof (review 14's line breaks)."""
    if re.search(r"[^\t\n\x20-\x7e]", src):
        return None
    if printed is None:
        from tgc.backends.llvm_compile import COMPILER
        from tgc.errors import CompileError
        try:
            printed = COMPILER.printed(src)
        except CompileError:
            return None
    return prove_printed(printed, contract)


def prove_printed(printed: str, contract: Contract) -> int | None:
    """`prove_short` of the kernel whose module LLVM printed as `printed` (`str(module)` of the module compiled:
    the server has it from its compile worker, `LLVMCompiler.compile_printed`)."""
    try:
        work = _prove(printed, contract)
    except (_No, ValueError, KeyError, IndexError, OverflowError):
        return None
    return work if work <= MAX_WORK else None


def _attr_groups(lines: list[str]) -> dict[str, set[str]]:
    """Attribute group number -> its attributes, of the module's `attributes #N = { ... }` lines (each listed once,
    each attribute one of `_ATTR`'s spellings)."""
    groups: dict[str, set[str]] = {}
    for ln in lines:
        m = _ATTR_GROUP.match(ln)
        if m:
            attrs = m.group(2).split(" ")
            if m.group(1) in groups or not all(_ATTR.fullmatch(a) for a in attrs):
                raise _No
            groups[m.group(1)] = set(attrs)
    return groups


def _prove(src: str, contract: Contract) -> int:
    """The work bound of the kernel LLVM printed as `src`: LLVM's own spelling, one instruction a line, every
    comment LLVM's (a source's comments, line breaks and blanks are gone in the print), which the patterns below
    read; the lexical checks of `_one_instruction` stay as a second line of defence."""
    if contract.vals or contract.local_size is not None:
        raise _No
    if re.search(r"[^\t\n\x20-\x7e]", src):
        raise _No  # (LLVM prints names and strings with escapes: only ASCII; kept from when the client's text was read)
    lines = [ln.rstrip(" \t") for ln in src.split("\n")]
    lines = [ln for ln in lines if ln]
    defines = [i for i, ln in enumerate(lines) if ln.startswith("define")]
    if len(defines) != 1 or lines.count("}") != 1:
        raise _No
    start, end = defines[0], lines.index("}")
    if end < start or end - start > MAX_LINES:
        raise _No
    groups = _attr_groups(lines[:start] + lines[end + 1:])
    for ln in lines[:start] + lines[end + 1:]:
        if _HEADER.match(ln) or _ATTR_GROUP.match(ln):
            continue
        m = _DECLARE.match(ln)
        if not (m and m.group(1) in _INTRINSICS) or m.group(3) and not groups[m.group(3)] <= _INTRINSIC_ATTRS:
            raise _No
    m = _DEFINE.match(lines[start])
    if not m or _a_library_function(m.group(1)) or not all(_KERNEL_ATTRS.fullmatch(a) for a in groups[m.group(3)]):
        raise _No
    params = _split(m.group(2))
    if params[-1] != "i32 %core_id":
        raise _No
    ptrs: dict[str, int] = {}  # pointer parameter -> its buffer index
    for p in params[:-1]:
        pm = _PARAM.match(p)
        if not pm or int(pm.group(1) or 1) > 64 or pm.group(2) in ptrs:
            raise _No
        ptrs[pm.group(2)] = len(ptrs)
    if len(ptrs) != len(contract.bufs):
        raise _No
    body = []
    for ln in lines[start + 1:end]:
        lm = _LABEL.match(ln)
        if lm:
            body.append(lm.group(1) + ":")  # (LLVM's comment of its predecessors dropped: the proof finds the edges)
        elif re.search(r'[;!"#{}\\]', ln):
            raise _No  # (no comment, metadata, quoted name, attribute group or braces on an instruction's line)
        else:
            body.append(ln.strip(" "))
    return _Prover(body, ptrs, contract).run()


# LLVM's tokens, as its lexer splits them: a name (`%x.1`, or a number `%0`), a numeric literal, a keyword or type,
# punctuation, blanks. A name, literal or word must end at a blank, punctuation or the line's end: LLVM reads `0store`
# as `0` then `store` and `%0ret` as `%0` then `ret`, where a pattern reading names and words greedily saw one token
_LEX = re.compile(r"""(?P<tok>[%@](?:[A-Za-z$._-][A-Za-z0-9$._-]*|[0-9]+)
                   |[-+]?(?:0x[KLMHR]?[0-9A-Fa-f]+|[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)
                   |(?P<word>[A-Za-z_][A-Za-z0-9_.]*))
                  |[,()\[\]<>{}=]|[ \t]+""", re.X)
_ENDS = frozenset(" \t,()[]<>{}=")


def _a_library_function(name: str) -> bool:
    """Whether a kernel named `name` would take the place of a function the process has (`sin`, `fmod`, `memset`):
    LLVM lowers intrinsics and some loops to calls of the C library, by name, and the kernel's own symbol answered
    them (review 15: `@sin` calling `llvm.sin.f64` recursed until the server died)."""
    import ctypes
    try:
        ctypes.CDLL(None)[name]
    except (AttributeError, OSError):
        return False
    return True


def _one_instruction(ln: str) -> None:
    """Refuses a line that is not exactly one instruction of plain operands, read as LLVM's lexer reads it: only
    its tokens (`_LEX`), one opcode word, no constant expression, and no global (`@`) but an intrinsic's name as a
    call's callee."""
    words, at = [], 0
    while at < len(ln):
        m = _LEX.match(ln, at)
        if m is None:
            raise _No
        at = m.end()
        if m.group("tok") is not None and at < len(ln) and ln[at] not in _ENDS:
            raise _No
        if m.group("word") is not None:
            words.append(m.group("word"))
            if re.fullmatch(r"i[0-9]+", m.group("word")) and m.group("word") not in ("i1", "i8", "i16", "i32", "i64"):
                raise _No  # (LLVM expands a division wider than 128 bits into a loop of one step a bit: review 15
                # ran an `udiv i16384` of weight 1 for seconds inline)
    if any(int(n) > MAX_LANES for n in re.findall(r"<\s*([0-9]+)\s*x\b", ln)):
        raise _No  # (a vector of thousands of lanes lives in stack slots no alloca counts)
    globals_ = re.findall(r"@[\w.$-]+", ln)
    if globals_ and not (len(globals_) == 1 and globals_[0].startswith("@llvm.")
                         and re.match(rf"(?:{_NAME} = )?call ", ln)):
        raise _No
    if sum(w in _OPCODES for w in words) != 1:
        raise _No


class _Prover:
    def __init__(self, body: list[str], ptrs: dict[str, int], contract: Contract):
        self.ptrs, self.contract = ptrs, contract
        self.blocks: list[tuple[str, list[str]]] = []
        for ln in body:
            if re.fullmatch(r"[\w.$-]+:", ln):
                self.blocks.append((ln[:-1], []))
            elif not self.blocks:
                raise _No
            else:
                _one_instruction(ln)
                self.blocks[-1][1].append(ln)
        self.index = {name: i for i, (name, _) in enumerate(self.blocks)}
        if len(self.index) != len(self.blocks) or not self.blocks or self.blocks[0][0] != "entry":
            raise _No
        # value -> (lo, hi) for integers known, None for unknown; poison: may be poison
        self.iv: dict[str, tuple[int, int] | None] = {"%core_id": (0, contract.global_size[0] - 1)}
        self.poison: set[str] = set()
        self.defined = {"%core_id", *ptrs}
        self.allocas: dict[str, str] = {}  # alloca -> its type
        self.geps: dict[str, tuple[int, int, int, int]] = {}  # gep -> (buffer, lo byte, hi byte, alignment)
        self.loops: dict[int, tuple[int, int, str, str, str]] = {}  # header -> (exit, latch, r, n, c)
        self.c: dict[int, tuple[int, str, int, bool]] = {}  # header -> (first, bound, preheader, unsigned)

    def run(self) -> int:
        self._find_loops()
        seen: set[str] = set()
        for _, insts in self.blocks:  # every value is defined once, and not as a parameter
            for ln in insts:
                m = re.match(rf"({_NAME}) = ", ln)
                if m:
                    if m.group(1) in seen or m.group(1) in self.defined:
                        raise _No
                    seen.add(m.group(1))
        self._check_loop_uses()
        weights, trips = [], {}
        for b, (_, insts) in enumerate(self.blocks):
            if b in self.loops:
                trips[b] = self._enter_loop(b)
            weights.append(sum(self._inst(b, k, ln, insts) for k, ln in enumerate(insts)))
        if any(n in self.poison for _, _, _, n, _ in self.loops.values()):
            raise _No  # (a branch on a counter that may be poison is undefined)
        work = 0
        for b, weight in enumerate(weights):
            count = 1
            for h, (e, _, _, _, _) in self.loops.items():
                if h < b < e:
                    count *= trips[h]
                elif h == b:
                    count *= trips[h] + 1
            work += count * weight
        return work * self.contract.global_size[0]

    # --- control flow

    def _targets(self, ln: str) -> list[str]:
        m = re.fullmatch(r"br label %([\w.$-]+)", ln)
        if m:
            return [m.group(1)]
        m = re.fullmatch(rf"br i1 {_NAME}, label %([\w.$-]+), label %([\w.$-]+)", ln)
        if m:
            return [m.group(1), m.group(2)]
        if ln == "ret void":
            return []
        raise _No

    def _find_loops(self) -> None:
        edges: list[tuple[int, int]] = []
        for b, (_, insts) in enumerate(self.blocks):
            if not insts:
                raise _No
            for ln in insts[:-1]:
                if ln.startswith(("br ", "ret")):
                    raise _No
            edges += [(b, self.index[t]) for t in self._targets(insts[-1])]
        for h, (_, insts) in enumerate(self.blocks):
            if not insts[0].startswith("%") or " = phi " not in insts[0]:
                continue
            if len(insts) != 3:
                raise _No
            pm = re.fullmatch(rf"({_NAME}) = phi i32 \[ (-?\d+), %([\w.$-]+) \], \[ ({_NAME}), %([\w.$-]+) \]",
                              insts[0])
            cm = re.fullmatch(rf"({_NAME}) = icmp (slt|ult) i32 ({_NAME}), (-?\d+|{_NAME})", insts[1])
            bm = re.fullmatch(rf"br i1 ({_NAME}), label %([\w.$-]+), label %([\w.$-]+)", insts[2])
            if not (pm and cm and bm) or cm.group(3) != pm.group(1) or bm.group(1) != cm.group(1):
                raise _No
            r, c0, pre, n, latch = pm.group(1), int(pm.group(2)), self.index[pm.group(3)], pm.group(4), \
                self.index[pm.group(5)]
            c1, body, ex = cm.group(4), self.index[bm.group(2)], self.index[bm.group(3)]
            if body != h + 1 or not body < ex or not pre < h or not h < latch < ex:
                raise _No
            if cm.group(2) == "ult" and c0 < 0 or not -(2**31) <= c0 < 2**31:
                raise _No
            self.loops[h] = (ex, latch, r, n, cm.group(1))
            self.c[h] = (c0, c1, pre, cm.group(2) == "ult")
        for src, dst in edges:
            if dst <= src:  # a back edge: only a latch to its header, unconditionally
                loop = self.loops.get(dst)
                if loop is None or loop[1] != src or self._targets(self.blocks[src][1][-1]) != [self.blocks[dst][0]]:
                    raise _No
        for h, (ex, latch, _, _, _) in self.loops.items():
            pre = self.c[h][2]
            for src, dst in edges:
                inside_src, inside_dst = h < src < ex, h < dst < ex
                if inside_dst and not (inside_src or (src == h and dst == h + 1)):
                    raise _No  # the loop's blocks are entered only from its header
                if inside_src and not (inside_dst or (dst == h and src == latch)):
                    raise _No  # ... and left only by the back edge
                if dst == h and src not in (pre, latch):
                    raise _No
            if (h, h + 1) not in edges or (pre, h) not in edges:
                raise _No

    def _enter_loop(self, h: int) -> int:
        """The most iterations of the loop of header `h` (its bound known by now), with its counter's interval."""
        _, latch, r, n, _ = self.loops[h]
        c0, bound, _, unsigned = self.c[h]
        if bound.startswith("%") and bound in self.poison:
            raise _No  # (a branch on poison is undefined)
        c1 = self._val(bound, "i32")
        if c1 is None or unsigned and c1[0] < 0 or not -(2**31) <= c1[0] <= c1[1] < 2**31:
            raise _No
        step = None
        for ln in self.blocks[latch][1]:
            m = re.fullmatch(rf"{re.escape(n)} = add( nuw)?(?: nsw)? i32 {re.escape(r)}, (\d+)", ln)
            if m:
                step = int(m.group(2))
                if m.group(1) and c0 < 0:
                    raise _No  # (`add nuw` of a negative counter wraps as unsigned: a poison step, an endless loop)
        hi = c1[1]
        if step is None or step < 1 or hi - 1 + step >= 2**31:
            raise _No
        self.iv[r] = (c0, max(c0, hi - 1))
        self.iv[n] = (c0 + step, max(c0, hi - 1) + step)
        self.defined.add(r)
        return max(0, -(-(hi - c0) // step))

    def _check_loop_uses(self) -> None:
        """A loop's counter is used only inside its loop (and by its header's compare and latch's step); its step
        only by its phi; the compare only by the header's branch."""
        used: dict[str, set[int]] = {}  # name -> the blocks that use it (one pass: linear in the source)
        for b, (_, insts) in enumerate(self.blocks):
            for ln in insts:
                for x in re.findall(_NAME + r"(?![\w.$-])", ln.split(" = ", 1)[1] if " = " in ln else ln):
                    used.setdefault(x, set()).add(b)
        for h, (ex, _, r, n, c) in self.loops.items():  # (the header's own lines: the pattern checked above)
            if used.get(c, set()) - {h} or used.get(n, set()) - {h}:
                raise _No
            if any(b != h and not h < b < ex for b in used.get(r, ())):
                raise _No

    # --- instructions

    def _val(self, tok: str, ty: str) -> tuple[int, int] | None:
        """The interval of an integer operand (None when unknown); refuses a name not defined before."""
        tok = tok.strip()
        if tok.startswith("%"):
            if tok not in self.defined or tok in self.ptrs or tok in self.allocas or tok in self.geps:
                raise _No
            return self.iv.get(tok)
        if tok in ("true", "false"):
            return (int(tok == "true"),) * 2
        if tok in ("zeroinitializer", "null"):
            return (0, 0)
        if re.fullmatch(r"-?\d+", tok):
            v, w = int(tok), int(ty[1:]) if re.fullmatch(r"i\d+", ty) else 0
            if w > 1:  # a literal as the signed value of its width (i8 200 is -56)
                v = (v + 2 ** (w - 1)) % 2**w - 2 ** (w - 1)
            return (v, v)
        return None

    def _uses(self, text: str) -> set[str]:
        names = set(re.findall(_NAME + r"(?![\w.$-])", text))
        for x in names:
            if x not in self.defined:
                raise _No
            if x in self.ptrs or x in self.allocas or x in self.geps:
                raise _No  # a pointer where only values may go
        return names

    def _poisoned(self, names: set[str], text: str) -> bool:
        return bool(names & self.poison) or bool(re.search(r"\b(poison|undef)\b", text))

    def _define(self, name: str, iv: tuple[int, int] | None, poison: bool, width: int | None = None) -> None:
        if width is not None and iv is not None and not -(2 ** (width - 1)) <= iv[0] <= iv[1] < 2 ** (width - 1):
            iv = None
        self.iv[name] = iv
        if poison:
            self.poison.add(name)
        self.defined.add(name)

    def _inst(self, b: int, k: int, ln: str, insts: list[str]) -> int:
        """Checks one instruction and records what it defines; its weight."""
        if b in self.loops and k < 3:
            return 1  # (the header's phi, compare and branch: checked in `_find_loops`)
        if k == len(insts) - 1:
            self._targets(ln)
            if ln.startswith("br i1"):
                raise _No  # conditional branches only in loop headers
            return 1
        m = re.fullmatch(rf"({_NAME}) = (\w+)((?: (?:{'|'.join(sorted(_FLAGS))}))*) (.*)", ln)
        if m is None:
            return self._store(ln)
        name, op, flags, rest = m.group(1), m.group(2), m.group(3).split(), m.group(4)
        if any(f not in _FLAGS for f in flags):
            raise _No
        if op == "alloca":
            am = re.fullmatch(rf"({_TYPE})(?:, align (\d+))?", rest)
            if b != 0 or am is None or (am.group(2) and not _abi_align(am.group(1)) <= int(am.group(2)) <= 64):
                raise _No
            self.allocas[name] = am.group(1)
            self.defined.add(name)
            if sum(_size(t) for t in self.allocas.values()) > MAX_STACK:
                raise _No
            return 1
        if op == "getelementptr":
            gm = re.fullmatch(rf"({_TYPE}), ptr ({_NAME}), (i32|i64) (\S+)", rest)
            if gm is None or gm.group(2) not in self.ptrs:
                raise _No
            idx = gm.group(4)
            if idx.startswith("%") and (idx in self.poison or idx not in self.defined):
                raise _No
            iv = self._val(idx, gm.group(3))
            if iv is None:
                raise _No
            size = _size(gm.group(1))
            self.geps[name] = (self.ptrs[gm.group(2)], iv[0] * size, iv[1] * size, _pow2_part(size))
            self.defined.add(name)
            return 1
        if op == "load":
            lm = re.fullmatch(rf"({_TYPE}), ptr ({_NAME})(?:, align (\d+))?", rest)
            if lm is None:
                raise _No
            self._access(lm.group(1), lm.group(2), lm.group(3))
            self._define(name, None, True)
            return _lanes(lm.group(1))
        if op == "call":
            cm = re.fullmatch(rf"({_TYPE}) @llvm\.(\w+)\.[\w.]+\((.*)\)", rest)
            if cm is None or cm.group(2) not in _INTRINSICS or not all(_ARG.fullmatch(a) for a in _split(cm.group(3))):
                raise _No
            self._uses(cm.group(3))
            self._define(name, None, True)
            return 4 * _lanes(cm.group(1))
        if op in _CASTS:
            km = re.fullmatch(rf"({_TYPE}) (\S+) to ({_TYPE})", rest)
            if km is None:
                raise _No
            names = self._uses(km.group(2))
            src_t, dst_t = km.group(1), km.group(3)
            iv = None
            if re.fullmatch(r"i\d+", src_t) and re.fullmatch(r"i\d+", dst_t) and op in ("sext", "zext", "trunc"):
                iv = self._val(km.group(2), src_t)
                if src_t == "i1":  # (i1 values are kept as 0 and 1: a sign extension makes 1 into -1)
                    iv = None if op == "sext" else (0, 1)
                elif op == "zext" and iv is not None and iv[0] < 0:
                    iv = (0, 2 ** int(src_t[1:]) - 1)
            self._define(name, iv, self._poisoned(names, rest) or bool(flags) or op in ("fptosi", "fptoui"),
                         int(dst_t[1:]) if re.fullmatch(r"i\d+", dst_t) else None)
            return _lanes(dst_t)
        if op in _INT_OPS or op in _FLOAT_OPS:
            om = re.fullmatch(rf"({_TYPE}) (.*)", rest)
            if om is None:
                raise _No
            ops = _split(om.group(2))
            if len(ops) != 2:
                raise _No
            names = self._uses(om.group(2))
            ty = om.group(1)
            poison = self._poisoned(names, rest)
            if op in _FLOAT_OPS:
                self._define(name, None, poison or bool(set(flags) & {"nnan", "ninf", "fast"}))
                return _lanes(ty) * (4 if op in ("fdiv", "frem") else 1)
            if op in ("sdiv", "udiv", "srem", "urem"):
                d = self._val(ops[1], ty) if not ops[1].startswith("%") else None
                if not re.fullmatch(r"-?\d+", ops[1]) or d is None or d[0] in (0, -1) or not ty.startswith("i"):
                    raise _No  # (a division by zero, or INT_MIN / -1, traps)
            if not re.fullmatch(r"i\d+", ty):  # integer vectors: checked for pointers and division, values unknown
                self._define(name, None, True)
                return _lanes(ty)
            width = int(ty[1:])
            a, c = self._val(ops[0], ty), self._val(ops[1], ty)
            iv, exact = _int_op(op, a, c, width)
            poison = poison or not exact and bool(set(flags) & {"nuw", "nsw"})
            if "nuw" in flags and not (iv is not None and a is not None and c is not None
                                       and min(a[0], c[0], iv[0]) >= 0):
                poison = True
            if {"exact", "disjoint"} & set(flags):
                poison = True
            if op in ("shl", "lshr", "ashr") and (c is None or not 0 <= c[0] <= c[1] < width):
                poison = True  # (a shift by the width or more is poison)
            self._define(name, iv, poison, width)
            return 1
        if op == "fneg":  # (a sign flip: cannot trap; a float is never an index)
            fm = re.fullmatch(r"((?:half|bfloat|float|double)|<\d+ x (?:half|bfloat|float|double)>) (\S+)", rest)
            if fm is None:
                raise _No
            names = self._uses(fm.group(2))
            self._define(name, None, self._poisoned(names, rest) or bool(set(flags) & {"nnan", "ninf", "fast"}))
            return _lanes(fm.group(1))
        if op in ("icmp", "fcmp"):
            if rest.startswith("samesign"):
                raise _No  # (poison where the signs differ: not modelled)
            names = self._uses(rest)
            self._define(name, (0, 1), self._poisoned(names, rest) or bool(set(flags) & {"nnan", "ninf", "fast"}))
            return 1
        if op == "select":
            sm = re.fullmatch(rf"(i1|<\d+ x i1>) (\S+), ({_TYPE}) (.+)", rest)
            if sm is None:
                raise _No
            names = self._uses(sm.group(2) + " " + sm.group(4))
            ops = _split(sm.group(4))
            if len(ops) != 2:
                raise _No
            ty = sm.group(3)
            iv = None
            if re.fullmatch(r"i\d+", ty):
                t = ops[1].split(" ", 1)
                if len(t) != 2 or t[0] != ty:
                    raise _No
                a, c = self._val(ops[0], ty), self._val(t[1], ty)
                iv = None if a is None or c is None else (min(a[0], c[0]), max(a[1], c[1]))
            self._define(name, iv, self._poisoned(names, rest) or bool(set(flags) & {"nnan", "ninf", "fast"}),
                         int(ty[1:]) if iv is not None else None)
            return _lanes(ty)
        if op in ("insertelement", "extractelement", "shufflevector"):
            self._uses(rest)
            if op != "shufflevector":  # (a lane read at a variable index reads a stack slot: of a partly poison
                # vector, the server thread's old stack; review 15) -- a literal lane of the vector only
                em = re.fullmatch(r"<([0-9]+) x .*, i(?:32|64) ([0-9]+)", rest)
                if em is None or int(em.group(2)) >= int(em.group(1)):
                    raise _No
            self._define(name, None, True)
            return 1
        raise _No

    def _store(self, ln: str) -> int:
        sm = re.fullmatch(rf"store ({_TYPE}) (.+), ptr ({_NAME})(?:, align (\d+))?", ln)
        if sm is None:
            raise _No
        self._uses(sm.group(2))
        self._access(sm.group(1), sm.group(3), sm.group(4))
        return _lanes(sm.group(1))

    def _access(self, ty: str, ptr: str, align: str | None) -> None:
        """A load or store of `ty` at `ptr` stays inside its alloca or buffer, aligned as it says."""
        need = int(align) if align else _abi_align(ty)
        if ptr in self.allocas:
            if self.allocas[ptr] != ty or need > _abi_align(ty):
                raise _No
            return
        if ptr in self.ptrs:
            buf, lo, hi, known = self.ptrs[ptr], 0, 0, 64
        elif ptr in self.geps:
            buf, lo, hi, known = self.geps[ptr]
        else:
            raise _No
        if lo < 0 or hi + _size(ty) > self.contract.bufs[buf] or need > known or need & (need - 1):
            raise _No


def _int_op(op: str, a: tuple[int, int] | None, c: tuple[int, int] | None, width: int
            ) -> tuple[tuple[int, int] | None, bool]:
    """The interval of `a op c` over exact integers (None: unknown), and whether it surely fits `width` bits
    signed (no wrap)."""
    if a is None or c is None:
        if op == "and" and (a is not None and a[0] >= 0 or c is not None and c[0] >= 0):
            hi = min(x[1] for x in (a, c) if x is not None and x[0] >= 0)
            return (0, hi), True
        return None, False
    iv: tuple[int, int] | None
    if op in ("add", "sub", "mul"):
        f = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y}[op]
        corners = [f(x, y) for x in a for y in c]
        iv = (min(corners), max(corners))
    elif op == "shl":
        if not 0 <= c[0] <= c[1] < width or a[0] < 0:
            return None, False
        iv = (a[0] << c[0], a[1] << c[1])
    elif op in ("lshr", "ashr"):
        if not 0 <= c[0] <= c[1] < width or a[0] < 0:
            return None, False
        iv = (a[0] >> c[1], a[1] >> c[0])
    elif op == "and":
        if a[0] < 0 and c[0] < 0:
            return None, False
        iv = (0, min(x[1] for x in (a, c) if x[0] >= 0))
    elif op in ("or", "xor"):
        if a[0] < 0 or c[0] < 0:
            return None, False
        iv = (0, (1 << max(a[1], c[1]).bit_length()) - 1)
    elif op in ("sdiv", "udiv"):
        if a[0] < 0 or c[0] != c[1] or c[0] <= 0:
            return None, False
        iv = (a[0] // c[0], a[1] // c[0])
    elif op in ("srem", "urem"):
        if a[0] < 0 or c[0] != c[1] or c[0] <= 0:
            return None, False
        iv = (0, min(a[1], c[0] - 1))
    else:
        return None, False
    fits = -(2 ** (width - 1)) <= iv[0] <= iv[1] < 2 ** (width - 1)
    return (iv if fits else None), fits


