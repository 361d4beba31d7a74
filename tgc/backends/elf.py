"""A small in-process loader for x86-64 ELF relocatable objects (`.o` files).

Why: compiling a CPU kernel with LLVM costs ~10 ms, but its object bytes can be cached on disk and
loaded by a later process in well under a millisecond, without importing llvmlite at all. This module
only needs the standard library (struct + ctypes).

What the object must look like -- create the llvmlite target machine with `make_target_machine()`, or
equivalently::

    target.create_target_machine(cpu=get_host_cpu_name(), features=get_host_cpu_features().flatten(),
                                 opt=3, reloc="pic", codemodel="small")

and emit with `tm.emit_object(module)`. Why these settings:

- `reloc="pic"`: all code and data references are RIP-relative (`R_X86_64_PC32`, `R_X86_64_PLT32`,
  `R_X86_64_GOTPCRELX`...), so the image can sit at any address. A `static` model may emit
  `R_X86_64_32S` absolute addresses that only fit in the low 2 GB, where mmap never puts the code.
- `codemodel="small"`: code and data of one object must lie within +-2 GB of each other. They do, as
  everything goes into a single mapping. Calls to far-away libraries (libm's `expf`...) go through a
  16-byte stub inside the mapping (`jmp *[rip+0]` followed by the 64-bit target), and references
  to external data go through a small GOT that the loader builds. The large code model would instead
  emit `R_X86_64_GOT64`/`GOTPC64`, which this loader does not handle.

How it lays out memory (one anonymous mmap, page-aligned regions):

    [ .text sections | call stubs ]  -> mprotect R+X
    [ .rodata* sections | GOT     ]  -> mprotect R
    [ .data* / .bss* / COMMON     ]  -> stays R+W

The mapping is never writable and executable at once: it is filled while RW, then the code pages are
switched to R+X. Unwind tables (`.eh_frame`) are not loaded, so C++-style exceptions cannot unwind
through loaded code (kernels do not need that). Static constructors (`.init_array`) and thread-local
storage are rejected with a clear error.

Half-float helpers: with the host CPU's features (F16C, AVX512-FP16, AVX512-BF16 on the project's
machines) LLVM 22 converts `half`/`bfloat` inline and emits no helper calls. With a generic CPU it calls
`__truncsfhf2`, `__extendhfsf2`, `__truncdfhf2` (found in libgcc_s from GCC 12 on) and `__truncsfbf2`
(not in GCC 12's libgcc_s); a helper that cannot be found raises `ElfLoadError` naming it.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["ElfLoadError", "LoadedObject", "load_object", "make_target_machine", "resolve_symbol"]


class ElfLoadError(ValueError):
    """The bytes are not a loadable x86-64 relocatable object (or use a feature this loader lacks)."""


# --- ELF constants (from the System V ABI and its x86-64 supplement) ---

ET_REL, EM_X86_64 = 1, 62
SHT_PROGBITS, SHT_SYMTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 1, 2, 4, 8, 9
SHT_INIT_ARRAY, SHT_PREINIT_ARRAY, SHT_X86_64_UNWIND = 14, 16, 0x70000001
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR, SHF_TLS = 0x1, 0x2, 0x4, 0x400
SHN_UNDEF, SHN_LORESERVE, SHN_ABS, SHN_COMMON = 0, 0xFF00, 0xFFF1, 0xFFF2
STB_LOCAL, STB_WEAK = 0, 2
STT_OBJECT, STT_FUNC, STT_SECTION, STT_TLS, STT_GNU_IFUNC = 1, 2, 3, 6, 10

R_NAMES = {
    0: "R_X86_64_NONE", 1: "R_X86_64_64", 2: "R_X86_64_PC32", 3: "R_X86_64_GOT32", 4: "R_X86_64_PLT32",
    5: "R_X86_64_COPY", 6: "R_X86_64_GLOB_DAT", 7: "R_X86_64_JUMP_SLOT", 8: "R_X86_64_RELATIVE",
    9: "R_X86_64_GOTPCREL", 10: "R_X86_64_32", 11: "R_X86_64_32S", 12: "R_X86_64_16", 13: "R_X86_64_PC16",
    14: "R_X86_64_8", 15: "R_X86_64_PC8", 16: "R_X86_64_DTPMOD64", 17: "R_X86_64_DTPOFF64",
    18: "R_X86_64_TPOFF64", 19: "R_X86_64_TLSGD", 20: "R_X86_64_TLSLD", 21: "R_X86_64_DTPOFF32",
    22: "R_X86_64_GOTTPOFF", 23: "R_X86_64_TPOFF32", 24: "R_X86_64_PC64", 25: "R_X86_64_GOTOFF64",
    26: "R_X86_64_GOTPC32", 27: "R_X86_64_GOT64", 28: "R_X86_64_GOTPCREL64", 29: "R_X86_64_GOTPC64",
    30: "R_X86_64_GOTPLT64", 31: "R_X86_64_PLTOFF64", 32: "R_X86_64_SIZE32", 33: "R_X86_64_SIZE64",
    34: "R_X86_64_GOTPC32_TLSDESC", 35: "R_X86_64_TLSDESC_CALL", 36: "R_X86_64_TLSDESC",
    37: "R_X86_64_IRELATIVE", 38: "R_X86_64_RELATIVE64", 41: "R_X86_64_GOTPCRELX", 42: "R_X86_64_REX_GOTPCRELX",
}
R_NONE, R_64, R_PC32, R_PLT32, R_GOTPCREL, R_32, R_32S, R_PC64 = 0, 1, 2, 4, 9, 10, 11, 24
R_GOTPCRELX, R_REX_GOTPCRELX = 41, 42
GOT_RELOCS = (R_GOTPCREL, R_GOTPCRELX, R_REX_GOTPCRELX)

# The supported relocation types -> (patch width in bytes, struct format, smallest value, largest value).
_S32 = (4, "<i", -(1 << 31), (1 << 31) - 1)
_APPLY: dict[int, tuple[int, str, int, int]] = {
    R_NONE: (0, "", 0, 0),
    R_64: (8, "<Q", -(1 << 63), (1 << 64) - 1),
    R_PC64: (8, "<Q", -(1 << 63), (1 << 63) - 1),
    R_PC32: _S32, R_PLT32: _S32, R_32S: _S32,
    R_GOTPCREL: _S32, R_GOTPCRELX: _S32, R_REX_GOTPCRELX: _S32,
    R_32: (4, "<I", 0, (1 << 32) - 1),
}

EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # ELF64 file header (64 bytes)
SHDR = struct.Struct("<IIQQQQIIQQ")  # section header (64 bytes)
SYM = struct.Struct("<IBBHQQ")  # symbol table entry (24 bytes)
RELA = struct.Struct("<QQq")  # relocation with addend (24 bytes)

# A call stub: `jmp qword ptr [rip+0]`, then the 8-byte absolute target, padded to 16 bytes with int3.
STUB_SIZE = 16
_STUB_JMP = b"\xff\x25\x00\x00\x00\x00"

PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20


def _align(x: int, a: int) -> int:
    return (x + a - 1) & ~(a - 1) if a > 1 else x


# --- libc access (mmap/mprotect/munmap) and default symbol lookup through ctypes ---

_libc: ctypes.CDLL | None = None
_libs: list[ctypes.CDLL] = []  # libraries searched by `resolve_symbol`, loaded lazily in order
_lib_names = [("m", "libm.so.6"), ("gcc_s", "libgcc_s.so.1")]


def _get_libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.mprotect.restype = ctypes.c_int
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.getpagesize.restype = ctypes.c_int
        _libc = libc
        _libs.append(libc)  # dlopen(NULL): the process itself, libc and everything already loaded
    return _libc


def _open_lib(short: str, soname: str) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(soname)
    except OSError:
        from ctypes.util import find_library  # slow (may run ldconfig): only when the usual soname is missing

        path = find_library(short)
        return ctypes.CDLL(path) if path else None


def resolve_symbol(name: str) -> int:
    """The address of a C symbol in the process, libm or libgcc_s; 0 when none of them defines it."""
    _get_libc()
    i = 0
    while i < len(_libs) or _lib_names:
        if i == len(_libs):  # not in any library opened so far: open the next one (once per process)
            lib = _open_lib(*_lib_names.pop(0))
            if lib is not None:
                _libs.append(lib)
            continue
        try:
            return ctypes.cast(_libs[i][name], ctypes.c_void_p).value or 0
        except AttributeError:
            i += 1
    return 0


def make_target_machine(opt: int = 3) -> Any:
    """An llvmlite target machine for the host whose objects `load_object` can load (PIC, small code model).

    Give the module the machine's triple and data layout before emitting (`mod.triple = tm.triple`,
    `mod.data_layout = str(tm.target_data)`), then call `tm.emit_object(mod)`.
    """
    import llvmlite.binding as llvm  # imported here so that loading objects never imports llvmlite

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                        opt=opt, reloc="pic", codemodel="small")


# --- the loaded image ---


class LoadedObject:
    """An object file mapped into memory and ready to call.

    `symbols` maps each defined global function to its address. The memory lives as long as this object:
    keep it referenced while any function pointer made from it may still be called.
    """

    def __init__(self, base: int, size: int, symbols: dict[str, int], globals_: dict[str, int]):
        self.base, self.size = base, size
        self.symbols = symbols
        self._globals = globals_  # every defined global symbol (functions and data)

    def address(self, name: str) -> int:
        """The address of a defined global symbol (usually a function)."""
        if self.base == 0:
            raise ValueError("LoadedObject is closed")
        try:
            return self._globals[name]
        except KeyError:
            raise KeyError(f"symbol '{name}' is not defined by this object; it defines: "
                           f"{', '.join(sorted(self._globals)) or '(nothing)'}") from None

    def close(self) -> None:
        """Unmap the memory. Function pointers into it must not be called afterwards."""
        if self.base:
            _get_libc().munmap(self.base, self.size)
            self.base = 0
            self.symbols, self._globals = {}, {}

    def __enter__(self) -> LoadedObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: ctypes may already be gone
            pass

    def __repr__(self) -> str:
        state = f"at 0x{self.base:x}, {self.size} bytes" if self.base else "closed"
        return f"<LoadedObject {state}, functions: {', '.join(self.symbols)}>"


# --- parsing ---


class _Section:
    __slots__ = ("index", "name", "type", "flags", "offset", "size", "link", "info", "align", "place")

    def __init__(self, index: int, fields: tuple[int, ...], names: bytes):
        (name_off, self.type, self.flags, _addr, self.offset, self.size, self.link, self.info, align, _ent) = fields
        self.index, self.name, self.align = index, _cstr(names, name_off), max(align, 1)
        self.place = -1  # offset inside the image; -1 while not loaded


def _cstr(table: bytes, off: int) -> str:
    end = table.find(b"\0", off)
    if off >= len(table) or end < 0:
        raise ElfLoadError(f"malformed ELF object: string offset {off} is outside its string table")
    return table[off:end].decode("utf-8", "replace")


def _section_bytes(obj: bytes, sec: _Section) -> bytes:
    if sec.offset + sec.size > len(obj):
        raise ElfLoadError(f"truncated ELF object: section '{sec.name}' ends at byte {sec.offset + sec.size}, "
                           f"but the object has {len(obj)} bytes")
    return obj[sec.offset:sec.offset + sec.size]


def _parse_sections(obj: bytes) -> list[_Section]:
    if not obj or not b"\x7fELF".startswith(obj[:4]):
        raise ElfLoadError("not an ELF object (the bytes do not start with \\x7fELF)")
    if len(obj) < EHDR.size:
        raise ElfLoadError(f"truncated ELF object: {len(obj)} bytes, shorter than the 64-byte ELF header")
    ident = obj[:16]
    if ident[4] != 2 or ident[5] != 1:
        raise ElfLoadError("unsupported ELF object: only 64-bit little-endian (ELFCLASS64, ELFDATA2LSB) is supported")
    (_, e_type, machine, _v, _entry, _phoff, shoff, _flags, _ehsize, _phsz, _phn, shentsize, shnum,
     shstrndx) = EHDR.unpack_from(obj)
    if machine != EM_X86_64:
        raise ElfLoadError(f"wrong machine: ELF e_machine is {machine}, expected {EM_X86_64} (EM_X86_64)")
    if e_type != ET_REL:
        raise ElfLoadError(f"unsupported ELF type {e_type}: expected a relocatable object (ET_REL, as from "
                           "emit_object), not an executable or shared library")
    if shentsize != SHDR.size or shnum == 0 or shstrndx >= shnum:
        raise ElfLoadError("malformed ELF object: bad section header table")
    if shoff + shnum * SHDR.size > len(obj):
        raise ElfLoadError(f"truncated ELF object: section headers end at byte {shoff + shnum * SHDR.size}, "
                           f"but the object has {len(obj)} bytes")
    raw = [SHDR.unpack_from(obj, shoff + i * SHDR.size) for i in range(shnum)]
    s = raw[shstrndx]
    if s[4] + s[5] > len(obj):
        raise ElfLoadError("truncated ELF object: the section name table is cut off")
    names = obj[s[4]:s[4] + s[5]]
    return [_Section(i, f, names) for i, f in enumerate(raw)]


def _is_loaded(sec: _Section) -> bool:
    """Should this section be copied into memory? Raises for sections we cannot honour."""
    if not sec.flags & SHF_ALLOC or sec.type == SHT_X86_64_UNWIND or sec.name == ".eh_frame":
        return False
    if sec.flags & SHF_TLS:
        raise ElfLoadError(f"unsupported: thread-local section '{sec.name}'")
    if sec.type in (SHT_INIT_ARRAY, SHT_PREINIT_ARRAY) and sec.size:
        raise ElfLoadError(f"unsupported: static constructors in '{sec.name}' (they would never run)")
    return sec.type in (SHT_PROGBITS, SHT_NOBITS)


def load_object(obj: bytes, resolve: Callable[[str], int] | None = None) -> LoadedObject:
    """Load an x86-64 ELF relocatable object (from `TargetMachine.emit_object`) into executable memory.

    `resolve(name)` gives the address of an undefined (external) symbol, or 0 when unknown; by default
    `resolve_symbol` looks in the process, libm and libgcc_s. Raises `ElfLoadError` (a `ValueError`) for
    input that is not such an object, that is truncated, that needs an unsupported relocation type, or
    that calls a symbol no one defines.
    """
    obj = bytes(obj)
    try:
        return _load(obj, resolve or resolve_symbol)
    except (struct.error, IndexError) as e:  # a cut-off table caught by struct rather than our checks
        raise ElfLoadError(f"malformed or truncated ELF object ({e})") from None


def _load(obj: bytes, resolve: Callable[[str], int]) -> LoadedObject:
    sections = _parse_sections(obj)
    symtabs = [s for s in sections if s.type == SHT_SYMTAB]
    if len(symtabs) != 1:
        raise ElfLoadError(f"malformed ELF object: expected one symbol table, found {len(symtabs)}")
    symtab = symtabs[0]
    if symtab.link >= len(sections):
        raise ElfLoadError("malformed ELF object: the symbol table links to a missing string table")
    strtab = _section_bytes(obj, sections[symtab.link])
    syms = list(SYM.iter_unpack(_section_bytes(obj, symtab)[: symtab.size - symtab.size % SYM.size]))

    # 1. Which sections to load, and the relocations that patch them.
    loaded = [s for s in sections if _is_loaded(s)]
    relocs: list[tuple[_Section, list[tuple[int, int, int]]]] = []
    for s in sections:
        if s.type not in (SHT_RELA, SHT_REL) or s.info >= len(sections) or not _is_loaded(sections[s.info]):
            continue
        if s.type == SHT_REL:
            raise ElfLoadError(f"unsupported: relocation section '{s.name}' without addends (SHT_REL)")
        if s.link != symtab.index:
            raise ElfLoadError(f"malformed ELF object: '{s.name}' does not use the symbol table")
        relocs.append((sections[s.info], list(RELA.iter_unpack(_section_bytes(obj, s)[: s.size - s.size % RELA.size]))))

    # 2. Undefined symbols: which need a call stub, which a GOT slot; look up their addresses.
    names: dict[int, str] = {}
    externals: dict[str, int] = {}  # name -> absolute address
    stubs: dict[str, int] = {}  # name -> stub number
    got: dict[int, int] = {}  # symbol index -> GOT slot number
    for _target, rels in relocs:
        for _off, info, _add in rels:
            si, rtype = info >> 32, info & 0xFFFFFFFF
            if rtype not in _APPLY:
                raise ElfLoadError(f"unsupported relocation type {R_NAMES.get(rtype, rtype)} "
                                   f"(use make_target_machine's reloc='pic', codemodel='small')")
            if si >= len(syms):
                raise ElfLoadError(f"malformed ELF object: relocation uses symbol {si} of {len(syms)}")
            if rtype in GOT_RELOCS:
                got.setdefault(si, len(got))
            st_name, st_info, _o, shndx, _val, _sz = syms[si]
            if shndx != SHN_UNDEF or si == 0:
                continue
            name = names[si] = _cstr(strtab, st_name)
            if name not in externals:
                addr = _lookup(resolve, name)
                if addr == 0 and st_info >> 4 != STB_WEAK:
                    raise ElfLoadError(_undefined_message(name))
                externals[name] = addr
            if rtype == R_PLT32:  # a call: libraries are too far for rel32, so call through a stub
                stubs.setdefault(name, len(stubs))

    # 3. Layout: code + stubs | read-only data + GOT | writable data + COMMON symbols, each page-aligned.
    page = _get_libc().getpagesize()
    code = [s for s in loaded if s.flags & SHF_EXECINSTR]
    rodata = [s for s in loaded if not s.flags & (SHF_EXECINSTR | SHF_WRITE)]
    data = [s for s in loaded if s.flags & SHF_WRITE and not s.flags & SHF_EXECINSTR]
    for s in loaded:
        if s.align > page:
            raise ElfLoadError(f"unsupported: section '{s.name}' wants {s.align}-byte alignment (> page size)")
    pos = 0
    for s in code:
        s.place = pos = _align(pos, s.align)
        pos += s.size
    stub_start = pos = _align(pos, STUB_SIZE)
    pos += STUB_SIZE * len(stubs)
    code_end = pos = _align(pos, page)
    for s in rodata:
        s.place = pos = _align(pos, s.align)
        pos += s.size
    got_start = pos = _align(pos, 8)
    pos += 8 * len(got)
    ro_end = pos = _align(pos, page)
    for s in data:
        s.place = pos = _align(pos, s.align)
        pos += s.size
    common: dict[int, int] = {}  # symbol index -> image offset
    for i, (_n, _info, _o, shndx, value, size) in enumerate(syms):
        if shndx == SHN_COMMON:  # `st_value` holds the alignment of a COMMON symbol
            common[i] = pos = _align(pos, max(value, 1))
            pos += size
    total = max(_align(pos, page), page)

    # 4. Map memory, then compute every symbol's address.
    libc = _get_libc()
    base = libc.mmap(None, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if base is None or base == ctypes.c_void_p(-1).value:
        raise MemoryError(f"mmap of {total} bytes failed (errno {ctypes.get_errno()})")
    try:
        result = _place(syms, strtab, sections, base, common, externals, names)
        image = bytearray(total)
        for s in loaded:
            if s.type != SHT_NOBITS and s.size:
                image[s.place:s.place + s.size] = _section_bytes(obj, s)
        for name, n in stubs.items():
            off = stub_start + STUB_SIZE * n
            image[off:off + STUB_SIZE] = _STUB_JMP + struct.pack("<Q", externals[name]) + b"\xcc\xcc"
        addrs = result.addrs
        for si, n in got.items():
            if si in result.unplaced:
                raise ElfLoadError("a GOT entry refers to a symbol in a section that is not loaded")
            struct.pack_into("<Q", image, got_start + 8 * n, addrs[si])
        stub_addr = {name: base + stub_start + STUB_SIZE * n for name, n in stubs.items()}
        got_addr = {si: base + got_start + 8 * n for si, n in got.items()}
        for target, rels in relocs:
            _relocate(image, target, rels, base, addrs, stub_addr, got_addr, names, result.unplaced)

        # 5. Copy in and protect: code R+X, read-only data (and the GOT) R, the rest stays RW.
        ctypes.memmove(base, (ctypes.c_char * total).from_buffer(image), total)
        for start, end, prot in ((0, code_end, PROT_READ | PROT_EXEC), (code_end, ro_end, PROT_READ)):
            if end > start and libc.mprotect(base + start, end - start, prot) != 0:
                raise OSError(ctypes.get_errno(), "mprotect failed")
    except BaseException:
        libc.munmap(base, total)
        raise
    return LoadedObject(base, total, result.functions, result.globals)


class _Placed:
    __slots__ = ("addrs", "functions", "globals", "unplaced")

    def __init__(self, addrs: list[int], functions: dict[str, int], globals_: dict[str, int], unplaced: set[int]):
        self.addrs, self.functions, self.globals, self.unplaced = addrs, functions, globals_, unplaced


def _place(syms: list[tuple[int, ...]], strtab: bytes, sections: list[_Section], base: int,
           common: dict[int, int], externals: dict[str, int], names: dict[int, str]) -> _Placed:
    """Absolute address of every symbol (0 where unused), plus the exported globals by name."""
    addrs = [0] * len(syms)
    functions: dict[str, int] = {}
    globals_: dict[str, int] = {}
    unplaced: set[int] = set()  # symbols defined in sections we do not load
    for i, (st_name, st_info, _o, shndx, value, _size) in enumerate(syms):
        stype, bind = st_info & 0xF, st_info >> 4
        if shndx == SHN_UNDEF:
            addrs[i] = externals.get(names[i], 0) if i in names else 0
            continue
        if stype in (STT_TLS, STT_GNU_IFUNC):
            raise ElfLoadError(f"unsupported: symbol '{_cstr(strtab, st_name)}' is thread-local or an ifunc")
        if shndx == SHN_ABS:
            addrs[i] = value
        elif shndx == SHN_COMMON:
            addrs[i] = base + common[i]
        elif shndx >= SHN_LORESERVE:
            raise ElfLoadError(f"unsupported: symbol with special section index 0x{shndx:x}")
        elif shndx < len(sections) and sections[shndx].place >= 0:
            addrs[i] = base + sections[shndx].place + value
        else:
            unplaced.add(i)  # e.g. in .eh_frame; an error only if something loaded refers to it
            continue
        if bind != STB_LOCAL and stype != STT_SECTION:
            name = _cstr(strtab, st_name)
            globals_[name] = addrs[i]
            if stype == STT_FUNC:
                functions[name] = addrs[i]
    return _Placed(addrs, functions, globals_, unplaced)


def _lookup(resolve: Callable[[str], int], name: str) -> int:
    try:
        return int(resolve(name) or 0)
    except KeyError:
        return 0


def _undefined_message(name: str) -> str:
    msg = f"undefined symbol '{name}': not found in the process, libm or libgcc_s"
    if name.startswith(("__trunc", "__extend")):
        msg += (" (a half/bfloat conversion helper; compile for the host CPU with make_target_machine so LLVM "
                "converts inline, or avoid this conversion in the CPU backend)")
    return msg


def _relocate(image: bytearray, target: _Section, rels: list[tuple[int, int, int]], base: int, addrs: list[int],
              stub_addr: dict[str, int], got_addr: dict[int, int], names: dict[int, str], unplaced: set[int]) -> None:
    """Patch one section's relocations in `image` (symbols: S, addend: A, place: P, GOT slot: G)."""
    for off, info, addend in rels:
        si, rtype = info >> 32, info & 0xFFFFFFFF
        if rtype == R_NONE:
            continue
        width = _APPLY[rtype][0]
        if off + width > target.size:
            raise ElfLoadError(f"malformed ELF object: relocation at {off} is outside section '{target.name}'")
        at = target.place + off
        place = base + at
        if rtype in GOT_RELOCS:
            value = got_addr[si] + addend - place
        elif rtype == R_PLT32 and si in names:
            value = stub_addr[names[si]] + addend - place  # external call: go through the stub
        else:
            if si in unplaced:
                raise ElfLoadError(f"relocation in '{target.name}' refers to a symbol in a section that is not loaded")
            sym = addrs[si]
            value = sym + addend - (place if rtype in (R_PC32, R_PLT32, R_PC64) else 0)
        fmt, lo, hi = _APPLY[rtype][1:]
        if not lo <= value <= hi:
            raise ElfLoadError(f"relocation {R_NAMES[rtype]} in '{target.name}' overflows: 0x{value:x} does not "
                               f"fit (use make_target_machine's reloc='pic', codemodel='small')")
        struct.pack_into(fmt, image, at, value & ((1 << (8 * width)) - 1) if fmt in ("<I", "<Q") else value)
