"""ELF reading and library resolution, on libraries compiled by the tests.

Where the resolver claims to know what ld.so does, the real loader is asked too: a fresh
Python dlopens the library and /proc/self/maps says which file it got.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from qnnctl.errors import IntegrityError
from qnnctl.host.elf import (
    VIA_CACHE,
    VIA_DEFAULT,
    VIA_LD_LIBRARY_PATH,
    VIA_RPATH,
    VIA_RUNPATH,
    Resolver,
    Scanner,
    glibc_needed,
    glibc_of,
    needed_libraries,
    read_elf,
)
from qnnctl.host.machine import glibc_version, parse_ld_cache, parse_ldconfig_output, read_ld_cache
from tests import genuine
from tests.conftest import require_tool
from tests.sdkfactory import compile_shared, for_another_machine

NEW_DTAGS = "-Wl,--enable-new-dtags"  # RUNPATH
OLD_DTAGS = "-Wl,--disable-new-dtags"  # RPATH

GLIBC_234_SOURCE = """
#include <pthread.h>
/* Bind to the symbol version glibc 2.34 introduced when libpthread moved into libc. */
__asm__(".symver pthread_create, pthread_create@GLIBC_2.34");
int start(pthread_t *t, void *(*f)(void *)) { return pthread_create(t, 0, f, 0); }
"""


def _library(path: Path, body: str = "", needs: tuple[Path, ...] = (), extra: tuple[str, ...] = ()) -> Path:
    """A shared library with soname = its file name, linked against `needs`."""
    decls = "".join(f"int {_sym(dep)}(void);\n" for dep in needs)
    calls = " + ".join(f"{_sym(dep)}()" for dep in needs) or "0"
    source = decls + f"int {_sym(path)}(void) {{ return {calls}; }}\n" + body
    args = [f"-Wl,-soname,{path.name}"]
    for dep in needs:
        args += [f"-L{dep.parent}", f"-l:{dep.name}"]
    return compile_shared(path, source, [*args, *extra])


def _sym(path: Path) -> str:
    return "f_" + "".join(c if c.isalnum() else "_" for c in path.name)


def loaded_by_real_loader(lib: Path, soname: str, ld_library_path: str | None) -> str:
    """The path ld.so picks for `soname` when `lib` is dlopened, or the loader's error."""
    code = (
        "import ctypes, sys\n"
        "try:\n"
        "    ctypes.CDLL(sys.argv[1])\n"
        "except OSError as exc:\n"
        "    print('error:', exc); raise SystemExit\n"
        "print(next(l.split()[-1] for l in open('/proc/self/maps') if l.rstrip().endswith('/' + sys.argv[2])))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    if ld_library_path is not None:
        env["LD_LIBRARY_PATH"] = ld_library_path
    out = subprocess.run([sys.executable, "-I", "-c", code, str(lib), soname], env=env,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _resolver(ld_library_path: str | None = None) -> Resolver:
    return Resolver(ld_library_path, read_ld_cache())


# -- reading ---------------------------------------------------------------------------------


def test_reads_needed_soname_and_expands_origin_in_runpath(tmp_path: Path) -> None:
    dep = _library(tmp_path / "deps" / "libdep.so")
    lib = _library(tmp_path / "lib" / "libtop.so", needs=(dep,),
                   extra=("-Wl,-rpath,$ORIGIN/../deps", NEW_DTAGS))
    info = read_elf(lib)
    assert info.soname == "libtop.so"
    assert info.needed == ("libdep.so",)
    assert info.runpath == (f"{tmp_path / 'lib'}/../deps",)
    assert info.rpath == ()


def test_reads_rpath_when_linked_with_old_dtags(tmp_path: Path) -> None:
    dep = _library(tmp_path / "deps" / "libdep.so")
    lib = _library(tmp_path / "lib" / "libtop.so", needs=(dep,),
                   extra=("-Wl,-rpath,${ORIGIN}/a:/opt/b", OLD_DTAGS))
    info = read_elf(lib)
    assert info.rpath == (f"{tmp_path / 'lib'}/a", "/opt/b")
    assert info.runpath == ()


def test_highest_glibc_version_needed(tmp_path: Path) -> None:
    host = glibc_version()
    if host is None or host < (2, 34):
        pytest.skip("linking against GLIBC_2.34 needs glibc 2.34 or newer on the build host")
    modern = compile_shared(tmp_path / "libmodern.so", GLIBC_234_SOURCE)
    plain = compile_shared(tmp_path / "libplain.so",
                           "#include <stdio.h>\nint hello(void) { return puts(\"hi\"); }\n")
    assert read_elf(modern).glibc == (2, 34)
    plain_glibc = read_elf(plain).glibc
    assert plain_glibc is not None
    assert plain_glibc < (2, 34)


def test_needed_libraries_reads_what_pyelftools_reads(tmp_path: Path) -> None:
    deps = tuple(_library(tmp_path / "deps" / f"lib{name}.so") for name in ("alpha", "beta", "gamma"))
    lib = _library(tmp_path / "lib" / "libtop.so", needs=deps, extra=("-Wl,-rpath,$ORIGIN", NEW_DTAGS))
    assert needed_libraries(lib) == read_elf(lib).needed == ("libalpha.so", "libbeta.so", "libgamma.so")
    system = Path(os.__file__).parents[1] / f"libpython{sys.version_info[0]}.{sys.version_info[1]}.so.1.0"
    for path in [*Path("/usr/lib/x86_64-linux-gnu").glob("libstdc++.so.6*"), system]:
        if path.is_file() and not path.is_symlink():
            assert needed_libraries(path) == read_elf(path).needed, path


def test_glibc_needed_reads_what_pyelftools_reads(tmp_path: Path) -> None:
    """The version needs read through DT_VERNEED, as `lower` reads them, agree with pyelftools'
    reading of .gnu.version_r: on libraries built here, on the host's, and on Qualcomm's own."""
    modern = compile_shared(tmp_path / "libmodern.so", GLIBC_234_SOURCE) if (glibc_version() or ()) >= (2, 34) else None
    plain = compile_shared(tmp_path / "libplain.so", "#include <stdio.h>\nint hello(void) { return puts(\"hi\"); }\n")
    bare = _library(tmp_path / "libbare.so")
    system = Path(os.__file__).parents[1] / f"libpython{sys.version_info[0]}.{sys.version_info[1]}.so.1.0"
    paths = [p for p in (modern, plain, bare, system, *Path("/usr/lib/x86_64-linux-gnu").glob("libstdc++.so.6*"))
             if p is not None and p.is_file() and not p.is_symlink()]
    wheel = genuine.wheel_path(genuine.QAIRT_2_51)
    if wheel is not None:
        with zipfile.ZipFile(genuine.cached_archive(genuine.QAIRT_2_51)) as archive:
            for member in archive.namelist():
                if f"/{genuine.HOST_LIB_DIR}/" in member and member.endswith(".so"):
                    (tmp_path / "genuine").mkdir(exist_ok=True)
                    paths.append(_write(tmp_path / "genuine", archive.read(member), Path(member).name))
    assert plain in paths
    seen = {path.name: glibc_needed(path) for path in paths}
    assert seen == {path.name: read_elf(path).glibc for path in paths}
    assert seen["libplain.so"] is not None
    if modern is not None:
        assert seen["libmodern.so"] == (2, 34)
    if wheel is not None:
        assert seen["libQnnHtp.so"] is not None  # the genuine libraries were read too


def test_glibc_needed_does_without_section_headers_and_refuses_damage(tmp_path: Path) -> None:
    plain = compile_shared(tmp_path / "libplain.so", "#include <stdio.h>\nint hello(void) { return puts(\"hi\"); }\n")
    expected = read_elf(plain).glibc
    data = bytearray(plain.read_bytes())
    struct.pack_into("<Q", data, 40, 0)  # e_shoff: no section headers, as ld.so never needs them
    struct.pack_into("<3H", data, 58, 0, 0, 0)
    assert glibc_needed(_write(tmp_path, bytes(data), "libnoheaders.so")) == expected
    cut = _write(tmp_path, plain.read_bytes()[:1200], "libcut.so")
    with pytest.raises(IntegrityError, match=r"libcut\.so"):
        glibc_needed(cut)


def test_needed_libraries_does_without_section_headers(tmp_path: Path) -> None:
    """ld.so reads program headers only; a library may have no section header table at all."""
    dep = _library(tmp_path / "libdep.so")
    lib = _library(tmp_path / "libtop.so", needs=(dep,))
    data = bytearray(lib.read_bytes())
    struct.pack_into("<Q", data, 40, 0)  # e_shoff
    struct.pack_into("<3H", data, 58, 0, 0, 0)  # e_shentsize, e_shnum, e_shstrndx
    lib.write_bytes(bytes(data))
    assert needed_libraries(lib) == ("libdep.so",)


def _synthetic_elf(bits: int, little: bool, needed: tuple[str, ...]) -> bytes:
    """A minimal ELF object: one PT_LOAD over the whole file at 0x10000, PT_DYNAMIC, a string table."""
    order = "<" if little else ">"
    wide = bits == 64
    ehsize, phentsize, dynsize = (64, 56, 16) if wide else (52, 32, 8)
    strings = b"\0" + b"".join(name.encode() + b"\0" for name in needed)
    offsets = [1 + sum(len(n) + 1 for n in needed[:i]) for i in range(len(needed))]
    dyn_at = ehsize + 2 * phentsize
    entries = [(1, o) for o in offsets] + [(5, 0), (10, len(strings)), (0, 0)]
    str_at = dyn_at + dynsize * len(entries)
    entries[len(offsets)] = (5, 0x10000 + str_at)
    total = str_at + len(strings)
    ident = b"\x7fELF" + bytes([2 if wide else 1, 1 if little else 2, 1]) + bytes(9)
    if wide:
        header = struct.pack(order + "HHIQQQIHHHHHH", 3, 62, 1, 0, ehsize, 0, 0, ehsize, phentsize, 2, 0, 0, 0)
        load = struct.pack(order + "IIQQQQQQ", 1, 4, 0, 0x10000, 0x10000, total, total, 0x1000)
        dynamic = struct.pack(order + "IIQQQQQQ", 2, 4, dyn_at, 0x10000 + dyn_at, 0, dynsize * len(entries),
                              dynsize * len(entries), 8)
        table = b"".join(struct.pack(order + "qQ", tag, value) for tag, value in entries)
    else:
        header = struct.pack(order + "HHIIIIIHHHHHH", 3, 20, 1, 0, ehsize, 0, 0, ehsize, phentsize, 2, 0, 0, 0)
        load = struct.pack(order + "IIIIIIII", 1, 0, 0x10000, 0x10000, total, total, 4, 0x1000)
        dynamic = struct.pack(order + "IIIIIIII", 2, dyn_at, 0x10000 + dyn_at, 0, dynsize * len(entries),
                              dynsize * len(entries), 4, 4)
        table = b"".join(struct.pack(order + "iI", tag, value) for tag, value in entries)
    return ident + header + load + dynamic + table + strings


@pytest.mark.parametrize(("bits", "little"), [(64, True), (64, False), (32, True), (32, False)])
def test_needed_libraries_of_every_class_and_byte_order(tmp_path: Path, bits: int, little: bool) -> None:
    path = tmp_path / "libsynthetic.so"
    path.write_bytes(_synthetic_elf(bits, little, ("libc++.so.1", "libc++abi.so.1", "libm.so.6")))
    # pyelftools, reading the same segments, vouches for the synthetic file.
    assert read_elf(path).needed == ("libc++.so.1", "libc++abi.so.1", "libm.so.6")
    assert needed_libraries(path) == ("libc++.so.1", "libc++abi.so.1", "libm.so.6")


def test_needed_libraries_trusts_no_size_in_a_damaged_file(tmp_path: Path) -> None:
    """Sizes in the headers are checked against the file before anything is read."""
    import tracemalloc

    lib = _library(tmp_path / "libtop.so", needs=(_library(tmp_path / "libdep.so"),))
    data = bytearray(lib.read_bytes())
    struct.pack_into("<2H", data, 54, 0xFFFF, 0xFFFF)  # e_phentsize, e_phnum: 4 GiB of headers
    huge = tmp_path / "libhuge.so"
    huge.write_bytes(bytes(data))
    tracemalloc.start()
    try:
        with pytest.raises(IntegrityError, match="ends early"):
            needed_libraries(huge)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_needed_libraries_bounds_each_name(tmp_path: Path) -> None:
    """Thousands of DT_NEEDED entries may point into one endless string: names stop at PATH_MAX."""
    path = tmp_path / "libendless.so"
    path.write_bytes(_synthetic_elf(64, True, ("lib" + "x" * 10000 + ".so",)))
    with pytest.raises(IntegrityError, match="without an end"):
        needed_libraries(path)


def test_needed_libraries_of_a_damaged_file_is_an_integrity_error(tmp_path: Path) -> None:
    lib = _library(tmp_path / "libtop.so", needs=(_library(tmp_path / "libdep.so"),))
    data = lib.read_bytes()
    cut = tmp_path / "libcut.so"
    cut.write_bytes(data[:200])
    with pytest.raises(IntegrityError, match="cannot read the ELF dynamic section"):
        needed_libraries(cut)
    text = tmp_path / "libtext.so"
    text.write_text("INPUT(libc.so.6)\n")
    with pytest.raises(IntegrityError, match="not an ELF file"):
        needed_libraries(text)


def test_glibc_of_symbol_versions() -> None:
    assert glibc_of("GLIBC_2.2.5") == (2, 2, 5)
    assert glibc_of("GLIBC_2.34") == (2, 34)
    assert glibc_of("GLIBC_PRIVATE") is None
    assert glibc_of("GLIBCXX_3.4.29") is None


def test_a_file_that_is_not_elf_is_an_integrity_error(tmp_path: Path) -> None:
    fake = tmp_path / "libfake.so"
    fake.write_text("INPUT(libc.so.6)\n")
    with pytest.raises(IntegrityError, match="not an ELF file"):
        read_elf(fake)


def test_host_glibc_is_what_the_c_library_says() -> None:
    """Read from confstr, it is what glibc's own gnu_get_libc_version() returns (through ctypes)."""
    import ctypes

    function = ctypes.CDLL(None).gnu_get_libc_version
    function.restype = ctypes.c_char_p
    version = glibc_version()
    assert version is not None
    assert len(version) >= 2
    assert function().decode() == ".".join(map(str, version))


# -- resolving -------------------------------------------------------------------------------


def test_a_library_this_host_lacks_is_missing(tmp_path: Path) -> None:
    dep = _library(tmp_path / "gone" / "libqnnctl_gone.so")
    lib = _library(tmp_path / "lib" / "libtop.so", needs=(dep,))
    dep.unlink()
    closure = Scanner(_resolver(str(tmp_path / "gone"))).closure([lib])
    assert closure.missing == {"libqnnctl_gone.so": [lib]}
    assert "cannot open shared object file" in loaded_by_real_loader(lib, "libqnnctl_gone.so", None)


def test_runpath_supplies_the_dependency(tmp_path: Path) -> None:
    dep = _library(tmp_path / "deps" / "libdep.so")
    lib = _library(tmp_path / "lib" / "libtop.so", needs=(dep,),
                   extra=("-Wl,-rpath,$ORIGIN/../deps", NEW_DTAGS))
    found = _resolver().find("libdep.so", [read_elf(lib)])
    assert found.via == VIA_RUNPATH
    assert found.path is not None
    assert found.path.resolve() == dep
    assert Path(loaded_by_real_loader(lib, "libdep.so", None)).resolve() == dep


@pytest.mark.parametrize(("dtags", "via"), [(OLD_DTAGS, VIA_RPATH), (NEW_DTAGS, VIA_LD_LIBRARY_PATH)])
def test_rpath_comes_before_ld_library_path_but_runpath_after(tmp_path: Path, dtags: str, via: str) -> None:
    own = _library(tmp_path / "own" / "libbar.so")
    env = _library(tmp_path / "env" / "libbar.so", body="int other(void) { return 2; }\n")
    lib = _library(tmp_path / "lib" / "libtop.so", needs=(own,), extra=(f"-Wl,-rpath,{own.parent}", dtags))
    found = _resolver(str(env.parent)).find("libbar.so", [read_elf(lib)])
    assert found.via == via
    expected = own if via == VIA_RPATH else env
    assert found.path == expected
    assert loaded_by_real_loader(lib, "libbar.so", str(env.parent)) == str(expected)


def test_rpath_of_the_loading_library_is_searched_too(tmp_path: Path) -> None:
    bar = _library(tmp_path / "shared" / "libbar.so")
    mid = _library(tmp_path / "mid" / "libmid.so", needs=(bar,))  # no RPATH of its own
    top = _library(tmp_path / "lib" / "libtop.so", needs=(mid,),
                   extra=(f"-Wl,-rpath,{mid.parent}:{bar.parent}", OLD_DTAGS))
    closure = Scanner(_resolver()).closure([top])
    assert closure.missing == {}
    [bar_found] = closure.found[mid]
    assert (bar_found.path, bar_found.via) == (bar, VIA_RPATH)
    assert loaded_by_real_loader(top, "libbar.so", None) == str(bar)


def test_a_library_with_runpath_inherits_no_rpath(tmp_path: Path) -> None:
    bar = _library(tmp_path / "shared" / "libbar.so")
    mid = _library(tmp_path / "mid" / "libmid.so", needs=(bar,), extra=("-Wl,-rpath,/nonexistent", NEW_DTAGS))
    top = _library(tmp_path / "lib" / "libtop.so", needs=(mid,),
                   extra=(f"-Wl,-rpath,{mid.parent}:{bar.parent}", OLD_DTAGS))
    closure = Scanner(_resolver()).closure([top])
    assert closure.missing == {"libbar.so": [mid]}
    assert "libbar.so: cannot open shared object file" in loaded_by_real_loader(top, "libbar.so", None)


def test_another_machine_is_passed_over_but_a_non_elf_file_stops_the_search(tmp_path: Path) -> None:
    good = _library(tmp_path / "good" / "libbar.so")
    lib = _library(tmp_path / "lib" / "libtop.so", needs=(good,))
    foreign = tmp_path / "foreign" / "libbar.so"
    foreign.parent.mkdir()
    foreign.write_bytes(for_another_machine(good.read_bytes()))
    search = f"{foreign.parent}:{good.parent}"
    found = _resolver(search).find("libbar.so", [read_elf(lib)])
    assert (found.path, found.via, found.error) == (good, VIA_LD_LIBRARY_PATH, None)
    assert loaded_by_real_loader(lib, "libbar.so", search) == str(good)

    junk = tmp_path / "junk" / "libbar.so"
    junk.parent.mkdir()
    junk.write_text("not a library\n" * 20)
    search = f"{junk.parent}:{good.parent}"
    closure = Scanner(_resolver(search)).closure([lib])
    assert list(closure.broken) == ["libbar.so"]
    assert "invalid ELF header" in loaded_by_real_loader(lib, "libbar.so", search)


def test_system_libraries_come_from_the_cache_or_default_folders(tmp_path: Path) -> None:
    lib = compile_shared(tmp_path / "libhello.so", "#include <stdio.h>\nint hello(void) { return puts(\"x\"); }\n")
    info = read_elf(lib)
    assert "libc.so.6" in info.needed
    found = _resolver().find("libc.so.6", [info])
    assert found.via == VIA_CACHE
    assert found.path is not None
    assert found.system
    no_cache = Resolver(None, {}).find("libc.so.6", [info])
    assert no_cache.via == VIA_DEFAULT
    assert no_cache.path is not None
    nowhere = Resolver(None, {}, default_dirs=()).find("libc.so.6", [info])
    assert nowhere.missing


def test_closure_follows_sdk_libraries_and_reports_the_highest_glibc(tmp_path: Path) -> None:
    host = glibc_version()
    if host is None or host < (2, 34):
        pytest.skip("linking against GLIBC_2.34 needs glibc 2.34 or newer on the build host")
    gone = _library(tmp_path / "deps" / "libgone.so")
    mid = _library(tmp_path / "deps" / "libmid.so", body=GLIBC_234_SOURCE, needs=(gone,))
    top = _library(tmp_path / "lib" / "libtop.so", needs=(mid,),
                   extra=("-Wl,-rpath,$ORIGIN/../deps", NEW_DTAGS))
    gone.unlink()
    closure = Scanner(_resolver()).closure([top])
    assert set(closure.libraries) == {top, mid.parent.parent / "lib" / ".." / "deps" / "libmid.so"}
    assert closure.missing == {"libgone.so": [mid.parent.parent / "lib" / ".." / "deps" / "libmid.so"]}
    highest = closure.highest_glibc()
    assert highest is not None
    assert highest[0] == (2, 34)
    assert highest[1].name == "libmid.so"


# -- the ldconfig cache ------------------------------------------------------------------------


def _ldconfig() -> str:
    for candidate in (shutil.which("ldconfig"), "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if candidate and os.path.isfile(candidate):
            return candidate
    return require_tool("ldconfig")


def _ldconfig_p(ldconfig: str, cache: str) -> dict[str, list[str]]:
    out = subprocess.run([ldconfig, "-C", cache, "-p"], capture_output=True, text=True, check=True)
    return parse_ldconfig_output(out.stdout)


def test_the_hosts_ld_so_cache_reads_as_ldconfig_lists_it() -> None:
    ldconfig = _ldconfig()
    if not os.path.isfile("/etc/ld.so.cache"):
        pytest.skip("this host has no /etc/ld.so.cache")
    parsed = read_ld_cache()
    assert parsed == _ldconfig_p(ldconfig, "/etc/ld.so.cache")
    assert "libc.so.6" in parsed


@pytest.mark.parametrize("fmt", ["new", "compat", "old"])
def test_every_cache_format_reads_as_ldconfig_lists_it(tmp_path: Path, fmt: str) -> None:
    ldconfig = _ldconfig()
    lib = _library(tmp_path / "libs" / "libqnnctlcache.so.1")
    conf = tmp_path / "ld.so.conf"
    conf.write_text(f"{lib.parent}\n")
    cache = tmp_path / f"ld.so.cache.{fmt}"
    subprocess.run([ldconfig, "-X", "-c", fmt, "-C", str(cache), "-f", str(conf)], check=True,
                   capture_output=True)
    data = cache.read_bytes()
    # The old format alone is left to `ldconfig -p`; the others are parsed here.
    assert (parse_ld_cache(data) is None) == (fmt == "old")
    entries = read_ld_cache(str(cache))
    assert entries["libqnnctlcache.so.1"] == [str(lib)]
    assert entries == _ldconfig_p(ldconfig, str(cache))


def test_an_unreadable_cache_is_empty(tmp_path: Path) -> None:
    assert read_ld_cache(str(tmp_path / "absent")) == {}


# -- the edges of reading and resolving ----------------------------------------------------------

EM_X86_64 = 62


def _elf(bits: int = 64, little: bool = True, needed: tuple[bytes, ...] = (b"libc++.so.1", b"libm.so.6"), *,
         base: int = 0x10000, paddr_shift: int = 0, memsz_extra: int = 0, strtab: bool = True,
         strsz: bool = True, dynamic: bool = True, dyn_pad: int = 0, split_load: bool = False,
         needed_offsets: tuple[int, ...] = (), no_headers: bool = False) -> bytes:
    """An ELF object built field by field, to reach the corners `_synthetic_elf` does not:
    addresses above 2**31 or 2**63, p_paddr and p_memsz that differ from p_vaddr and p_filesz,
    a string table at the very start of a segment of its own (`split_load`: right after the end
    of another one, whose p_memsz, with `memsz_extra`, reaches over it), missing tags, no
    program headers."""
    order = "<" if little else ">"
    wide = bits == 64
    ehsize, phentsize, dynsize = (64, 56, 16) if wide else (52, 32, 8)
    strings = b"\0" + b"".join(name + b"\0" for name in needed)
    offsets = [1 + sum(len(n) + 1 for n in needed[:i]) for i in range(len(needed))] + list(needed_offsets)
    phnum = (2 if split_load else 1) + (1 if dynamic else 0)
    dyn_at = ehsize + phnum * phentsize
    count = len(offsets) + int(strtab) + int(strsz) + 1
    str_at = dyn_at + dynsize * count + dyn_pad
    total = str_at + len(strings)
    strings_at = base + 0x100000 if split_load else base + str_at
    entries = [(1, o) for o in offsets]
    entries += [(5, strings_at)] if strtab else []
    entries += [(10, len(strings))] if strsz else []
    entries += [(0, 0)]
    phdr = order + ("IIQQQQQQ" if wide else "IIIIIIII")

    def segment(kind: int, offset: int, vaddr: int, filesz: int, memsz: int) -> bytes:
        if wide:
            return struct.pack(phdr, kind, 4, offset, vaddr, vaddr + paddr_shift, filesz, memsz, 8)
        return struct.pack(phdr, kind, offset, vaddr, vaddr + paddr_shift, filesz, memsz, 4, 4)

    if split_load:
        # The first segment ends exactly where the string table's address begins, 16 bytes of
        # the file before the table itself; the second maps the table alone.
        first = str_at - 16
        loads = segment(1, 0, strings_at - first, first, first + memsz_extra) + segment(
            1, str_at, strings_at, len(strings), len(strings))
    else:
        loads = segment(1, 0, base, total, total + memsz_extra)
    dyn = segment(2, dyn_at, base + dyn_at, dynsize * count + dyn_pad, dynsize * count + dyn_pad) if dynamic else b""
    ident = b"\x7fELF" + bytes([2 if wide else 1, 1 if little else 2, 1]) + bytes(9)
    shown_phnum = 0 if no_headers else phnum
    if wide:
        header = struct.pack(order + "HHIQQQIHHHHHH", 3, EM_X86_64, 1, 0, ehsize, 0, 0, ehsize, phentsize,
                             shown_phnum, 0, 0, 0)
        table = b"".join(struct.pack(order + "qQ", tag, value) for tag, value in entries)
    else:
        header = struct.pack(order + "HHIIIIIHHHHHH", 3, EM_X86_64, 1, 0, ehsize, 0, 0, ehsize, phentsize,
                             shown_phnum, 0, 0, 0)
        table = b"".join(struct.pack(order + "iI", tag, value) for tag, value in entries)
    return ident + header + loads + dyn + table + bytes(dyn_pad) + strings


def _write(tmp_path: Path, data: bytes, name: str = "libx.so") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(("bits", "little"), [(64, True), (64, False), (32, True), (32, False)])
def test_needed_libraries_reads_segments_by_their_addresses_and_file_sizes(tmp_path: Path, bits: int,
                                                                          little: bool) -> None:
    """The loader maps by p_vaddr and p_filesz: p_paddr and p_memsz say nothing of where the
    string table is, and addresses may use the top bit of their width."""
    high = 0xFFFF_FFFF_0000_0000 if bits == 64 else 0xC000_0000
    cases = {"plain": {}, "paddr": {"paddr_shift": 0x4000}, "bss": {"memsz_extra": 0x2000},
             "high": {"base": high}, "split": {"split_load": True}, "padded": {"dyn_pad": 3},
             # The first segment's memory (not its file part) reaches over the string table.
             "split-bss": {"split_load": True, "memsz_extra": 0x1000}}
    for name, options in cases.items():
        path = _write(tmp_path, _elf(bits, little, **options), f"lib{name}.so")  # type: ignore[arg-type]
        assert needed_libraries(path) == ("libc++.so.1", "libm.so.6"), name


def test_needed_libraries_of_objects_that_need_nothing(tmp_path: Path) -> None:
    assert needed_libraries(_write(tmp_path, _elf(dynamic=False), "static.so")) == ()
    assert needed_libraries(_write(tmp_path, _elf(no_headers=True), "object.o")) == ()
    assert needed_libraries(_write(tmp_path, _elf(needed=()), "libnone.so")) == ()


def test_needed_libraries_keeps_odd_names_and_bounds_their_number(tmp_path: Path) -> None:
    assert needed_libraries(_write(tmp_path, _elf(needed=(b"lib\xff.so",)))) == ("lib\udcff.so",)
    assert needed_libraries(_write(tmp_path, _elf(needed=(b"liba.so",), needed_offsets=(0,)), "e.so")) == (
        "liba.so", "")
    many = tuple(f"l{i}".encode() for i in range(1100))
    assert needed_libraries(_write(tmp_path, _elf(needed=many), "many.so")) == tuple(
        name.decode() for name in many[:1024])


@pytest.mark.parametrize(("options", "why"), [
    ({"strtab": False}, "DT_NEEDED without a string table"),
    ({"strsz": False}, "DT_NEEDED without a string table"),
    ({"needed": (b"libc++.so.1",), "_outside": True}, "the string table is in no loaded segment"),
    ({"_endless": True}, "a DT_NEEDED name without an end"),
    ({"_phentsize": 8}, "program headers of 8 bytes"),
    ({"_truncated": True}, "the file ends early"),
], ids=["no-strtab", "no-strsz", "strtab-outside", "endless-name", "small-phentsize", "truncated"])
def test_needed_libraries_says_why_a_file_cannot_be_read(tmp_path: Path, options: dict[str, object],
                                                         why: str) -> None:
    special = {k: v for k, v in options.items() if k.startswith("_")}
    data = bytearray(_elf(**{k: v for k, v in options.items() if k not in special}))  # type: ignore[arg-type]
    if special.get("_outside"):
        # DT_STRTAB names an address past the one PT_LOAD segment.
        at = data.find(struct.pack("<qQ", 5, 0x10000 + len(data) - len(b"\0libc++.so.1\0")))
        assert at > 0
        struct.pack_into("<qQ", data, at, 5, 0x900000)
    if special.get("_endless"):
        data = bytearray(_synthetic_elf(64, True, ("lib" + "x" * 10000 + ".so",)))
    if special.get("_phentsize"):
        struct.pack_into("<H", data, 54, 8)
    if special.get("_truncated"):
        data = data[:70]
    path = _write(tmp_path, bytes(data))
    with pytest.raises(IntegrityError) as caught:
        needed_libraries(path)
    assert caught.value.message == f"cannot read the ELF dynamic section of {path}: {why}"
    assert caught.value.hint == "the file is damaged or truncated; reinstall the SDK it belongs to"


def test_a_file_that_is_not_elf_is_named_with_the_fix(tmp_path: Path) -> None:
    fake = _write(tmp_path, b"INPUT(libc.so.6)\n" * 4)
    for reader in (needed_libraries, read_elf):
        with pytest.raises(IntegrityError) as caught:
            reader(fake)
        assert (caught.value.message, caught.value.hint) == (f"{fake} is not an ELF file",
                                                             "reinstall the SDK it belongs to")


def test_read_elf_of_a_damaged_file_gives_its_path_and_cause(tmp_path: Path) -> None:
    lib = _library(tmp_path / "libtop.so", needs=(_library(tmp_path / "libdep.so"),))
    cut = _write(tmp_path, lib.read_bytes()[:200], "libcut.so")
    with pytest.raises(IntegrityError) as caught:
        read_elf(cut)
    prefix = f"cannot read the ELF dynamic section of {cut}: "
    assert caught.value.message.startswith(prefix)
    assert caught.value.message[len(prefix):] not in ("", "None")
    assert caught.value.hint == "the file is damaged or truncated; reinstall the SDK it belongs to"


def test_read_elf_of_a_library_without_a_soname(tmp_path: Path) -> None:
    lib = compile_shared(tmp_path / "libanon.so", "int anon(void) { return 1; }\n")
    info = read_elf(lib)
    assert info.path == lib
    assert info.soname is None


@pytest.mark.parametrize(("head", "identity"), [
    (bytes([2, 1]), (64, True, EM_X86_64)),
    (bytes([1, 2]), (32, False, EM_X86_64)),
    (bytes([3, 1]), None),  # no such class
    (bytes([2, 3]), None),  # no such byte order
], ids=["64-little", "32-big", "bad-class", "bad-order"])
def test_elf_identity_reads_class_order_and_machine(tmp_path: Path, head: bytes,
                                                    identity: tuple[int, bool, int] | None) -> None:
    from qnnctl.host.staged import elf_identity

    little = head[1] == 1
    data = b"\x7fELF" + head + b"\x01" + bytes(9) + (3).to_bytes(2, "little" if little else "big") + \
        EM_X86_64.to_bytes(2, "little" if little else "big") + b"\x01\x00\x00\x00"
    found = elf_identity(_write(tmp_path, data))
    assert (None if found is None else (found.bits, found.little_endian, found.machine)) == identity


def test_elf_identity_of_what_is_not_an_elf_header(tmp_path: Path) -> None:
    from qnnctl.host.staged import elf_identity

    real = _library(tmp_path / "libreal.so")
    identity = elf_identity(real)
    assert identity is not None
    assert (identity.bits, identity.little_endian, identity.machine) == (64, True, EM_X86_64)
    head = real.read_bytes()[:20]
    assert elf_identity(_write(tmp_path, head[:6], "short")) is None  # the magic, and too short
    assert elf_identity(_write(tmp_path, b"\x7fELG" + head[4:], "magic")) is None
    assert elf_identity(tmp_path / "absent") is None


def test_split_search_path_separators_and_origin() -> None:
    from qnnctl.host.elf import split_search_path

    assert split_search_path("/opt/X11:/b") == ("/opt/X11", "/b")
    assert split_search_path("$ORIGIN/x:") == ("$ORIGIN/x", "")  # no origin given: left as it is
    assert split_search_path("$ORIGIN/x", Path("/lib/o")) == ("/lib/o/x",)


def test_names_with_a_slash_and_relative_folders_are_found_from_the_working_folder(tmp_path: Path) -> None:
    from qnnctl.host.elf import VIA_PATH, Found

    lib = _library(tmp_path / "sub" / "libx.so")
    info = read_elf(lib)
    resolver = Resolver(None, {}, default_dirs=(), cwd=tmp_path)
    assert resolver.find("sub/libx.so", [info]) == Found("sub/libx.so", tmp_path / "sub" / "libx.so", VIA_PATH)
    assert resolver.find(str(lib), [info]) == Found(str(lib), lib, VIA_PATH)
    assert resolver.find("sub/libnone.so", [info]) == Found("sub/libnone.so", None, None)
    # Relative and empty LD_LIBRARY_PATH entries, split at ':' and ';', are the working folder's.
    assert Resolver("nowhere;sub", {}, (), cwd=tmp_path).find("libx.so", [info]) == Found(
        "libx.so", tmp_path / "sub" / "libx.so", VIA_LD_LIBRARY_PATH)
    (tmp_path / "libtop.so").write_bytes(lib.read_bytes())
    assert Resolver(":", {}, (), cwd=tmp_path).find("libtop.so", [info]) == Found(
        "libtop.so", tmp_path / "libtop.so", VIA_LD_LIBRARY_PATH)
    (tmp_path / "X11").mkdir()
    (tmp_path / "X11" / "libx11.so").write_bytes(lib.read_bytes())
    assert Resolver("X11", {}, (), cwd=tmp_path).find("libx11.so", [info]) == Found(
        "libx11.so", tmp_path / "X11" / "libx11.so", VIA_LD_LIBRARY_PATH)


def test_the_working_folder_is_the_processs_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = _library(tmp_path / "sub" / "libx.so")
    monkeypatch.chdir(tmp_path)
    found = Resolver("sub", {}, ()).find("libx.so", [read_elf(lib)])
    assert found.path == tmp_path / "sub" / "libx.so"


def test_every_rule_names_what_it_found(tmp_path: Path) -> None:
    from qnnctl.host.elf import Found

    dep = _library(tmp_path / "deps" / "libdep.so")
    info = read_elf(_library(tmp_path / "lib" / "libtop.so", needs=(dep,),
                             extra=(f"-Wl,-rpath,{dep.parent}", OLD_DTAGS)))
    assert Resolver(None, {}, ()).find("libdep.so", [info]) == Found("libdep.so", dep, VIA_RPATH)
    plain = read_elf(_library(tmp_path / "plain" / "libtop.so", needs=(dep,)))
    assert Resolver(None, {"libdep.so": [str(dep)]}, ()).find("libdep.so", [plain]) == Found(
        "libdep.so", dep, VIA_CACHE)
    assert Resolver(None, {}, (str(dep.parent),)).find("libdep.so", [plain]) == Found(
        "libdep.so", dep, VIA_DEFAULT)
    # A cache entry for a file that has gone is passed over.
    assert Resolver(None, {"libdep.so": [str(tmp_path / "gone" / "libdep.so")]}, (str(dep.parent),)).find(
        "libdep.so", [plain]) == Found("libdep.so", dep, VIA_DEFAULT)
    junk = tmp_path / "junk" / "libdep.so"
    junk.parent.mkdir()
    junk.write_text("not a library\n" * 20)
    assert Resolver(str(junk.parent), {}, ()).find("libdep.so", [plain]) == Found(
        "libdep.so", junk, VIA_LD_LIBRARY_PATH, error=f"{junk} is not an ELF library (the loader stops there)")


def test_the_closure_reads_each_library_once_and_keeps_going(tmp_path: Path) -> None:
    # Two libraries that need each other: the walk ends.
    a = _library(tmp_path / "libloop_a.so", body="int f_libloop_b_so(void);\n")
    b = _library(tmp_path / "libloop_b.so", needs=(a,))
    a = _library(tmp_path / "libloop_a.so", needs=(b,))
    fake = _write(tmp_path, b"INPUT(libc.so.6)\n" * 4, "libfake.so")
    junk = tmp_path / "junk" / "libjunk.so"
    junk.parent.mkdir()
    junk.write_text("not a library\n" * 20)
    needs_junk = compile_shared(tmp_path / "libneedsjunk.so", "int f(void) { return 1; }\n",
                                [f"-L{tmp_path}", "-l:libloop_b.so"])
    closure = Scanner(Resolver(str(tmp_path), {}, ())).closure([fake, a, a, b, needs_junk])
    assert closure.unreadable == {fake: f"{fake} is not an ELF file"}
    assert set(closure.libraries) == {a, b, needs_junk}
    # A needed name found as a file the loader would stop at is broken, with why.
    (tmp_path / "libloop_b.so").rename(tmp_path / "libloop_b.real")
    (tmp_path / "libloop_b.so").write_text("not a library\n" * 20)
    broken = Scanner(Resolver(str(tmp_path), {}, ())).closure([a])
    assert broken.broken == {"libloop_b.so": f"{tmp_path / 'libloop_b.so'} is not an ELF library "
                                             "(the loader stops there)"}


def test_the_highest_glibc_is_the_first_library_needing_it(tmp_path: Path) -> None:
    from qnnctl.host.elf import Closure, ElfInfo
    from qnnctl.host.staged import ElfIdentity

    identity = ElfIdentity(64, True, EM_X86_64)

    def info(name: str, glibc: tuple[int, ...] | None) -> ElfInfo:
        return ElfInfo(path=tmp_path / name, identity=identity, soname=None, needed=(), rpath=(), runpath=(),
                       glibc=glibc)

    closure = Closure(roots=[])
    closure.libraries.update({tmp_path / n: info(n, g) for n, g in [
        ("a", (2, 17)), ("b", (2, 34)), ("c", None), ("d", (2, 34)), ("e", (2, 28))]})
    assert closure.highest_glibc() == ((2, 34), tmp_path / "b")
    assert Closure(roots=[]).highest_glibc() is None
