#!/usr/bin/env python3
"""Compares the kernels of two builds of CUDA sources, function by function, without a GPU.

usage: kernel_code_diff.py BEFORE_DIR AFTER_DIR [--rename FROM=TO ...]

Each dir holds, at any depth, the cubins that nvcc --keep left (*.compute_90a.cubin,
*.compute_90.cubin) and the ptxas -v reports (*.ptxas.txt); scripts/check-sass-identical.sh
builds them. A function is matched by its demangled name (c++filt) with the
renames applied, e.g. --rename "(anonymous namespace)=attn" when code moved out of an anonymous
namespace. Per function and architecture it compares the machine code (the .text bytes: equal
bytes are equal SASS), its relocations and .nv.info attributes (symbols by name), the size of its
static shared memory section, and ptxas' registers, barriers, stack, spills and shared memory.
Exit status 1 when the code or ptxas' registers, stack or spills differ; shared memory that only
moved (the module's layout: which kernels share a file) is reported, and does not fail.
"""
import argparse
import collections
import glob
import os
import re
import struct
import subprocess
import sys

SECTION_PREFIXES = (".nv.constant0.", ".nv.shared.", ".text.", ".nv.info.")


def read_elf(path):
    data = open(path, "rb").read()
    assert data[:4] == b"\x7fELF" and data[4] == 2, path
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = []
    for i in range(shnum):
        name, kind, flags, _, offset, size, link, info, align, _ = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize)
        sections.append(dict(name=name, kind=kind, flags=flags, offset=offset, size=size,
                             link=link, info=info, align=align))

    def string(table, at):
        start = table["offset"] + at
        return data[start:data.index(b"\0", start)].decode()

    for s in sections:
        s["name"] = string(sections[shstrndx], s["name"])
        s["bytes"] = b"" if s["kind"] == 8 else data[s["offset"]:s["offset"] + s["size"]]
    symtab = next(s for s in sections if s["kind"] == 2)
    symbols = []
    for i in range(symtab["size"] // 24):
        name, info, _, shndx, _, _ = struct.unpack_from("<IBBHQQ", data, symtab["offset"] + 24 * i)
        name = string(sections[symtab["link"]], name) if name else ""
        if not name and info & 0xF == 3:  # a section's symbol
            name = sections[shndx]["name"]
        symbols.append(name)
    return sections, symbols


def demangler(names, renames):
    names = sorted(set(names))
    plain = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                           check=True).stdout.splitlines()
    table = dict(zip(names, plain))

    def key(name):
        for prefix in SECTION_PREFIXES:
            if name.startswith(prefix):
                return prefix + key(name[len(prefix):])
        out = table.get(name, name)
        for old, new in renames:
            out = out.replace(old, new)
        return out

    return key


def nv_info(raw, symbols, key):
    """The attributes of an .nv.info section; EIATTR_PARAM_CBANK's symbol by name."""
    out, i = [], 0
    while i < len(raw):
        fmt, attr, (half,) = raw[i], raw[i + 1], struct.unpack_from("<H", raw, i + 2)
        i += 4
        value = raw[i:i + half] if fmt == 4 else struct.pack("<H", half)  # EIFMT_SVAL: sized
        i += half if fmt == 4 else 0
        if fmt == 4 and attr == 0x0A:
            value = (key(symbols[struct.unpack_from("<I", value)[0]]), value[4:])
        out.append((fmt, attr, value))
    return out


def cubin_functions(folder, arch, renames):
    """Per demangled name, its instances (one a file that compiles it)."""
    functions = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(folder, "**", "*.%s.cubin" % arch), recursive=True)):
        sections, symbols = read_elf(path)
        key = demangler([s for s in symbols if s] + [
            s["name"].split(".", 3)[-1] for s in sections if s["name"].startswith(".nv.")], renames)
        by_name = {s["name"]: s for s in sections}
        for index, s in enumerate(sections):
            if not s["name"].startswith(".text."):
                continue
            name = s["name"][len(".text."):]
            relocations = []
            for r in sections:
                if r["kind"] in (4, 9) and r["info"] == index:  # RELA, REL
                    size = 24 if r["kind"] == 4 else 16
                    for at in range(0, r["size"], size):
                        offset, info = struct.unpack_from("<QQ", r["bytes"], at)
                        rela = size == 24
                        addend = struct.unpack_from("<q", r["bytes"], at + 16)[0] if rela else 0
                        relocations.append(
                            (offset, info & 0xFFFFFFFF, key(symbols[info >> 32]), addend))
            info = by_name.get(".nv.info." + name)
            shared = by_name.get(".nv.shared." + name)
            functions[key(name)].append(dict(
                code=(s["bytes"], s["flags"], key(symbols[s["info"]]), s["align"]),
                relocations=sorted(relocations),
                attributes=nv_info(info["bytes"], symbols, key) if info else None,
                shared=(shared["size"], shared["align"]) if shared else None,
                file=os.path.basename(path)))
    return functions


def ptxas_reports(folder, renames):
    """Per (function, sm): what ptxas -v says of each instance (stack and spills, registers...)."""
    lines, current = {}, None
    for path in glob.glob(os.path.join(folder, "**", "*.ptxas.txt"), recursive=True):
        for line in open(path):
            entry = re.search(r"Compiling entry function '([^']+)' for '(\w+)'", line)
            if entry:
                current = (entry.group(1), entry.group(2))
                lines.setdefault(current, []).append([])
            elif current and ("bytes stack frame" in line or "Used " in line):
                lines[current][-1].append(line.split(":", 1)[-1].strip())
            elif "Compile time" in line:
                current = None
    key = demangler([name for name, _ in lines], renames)
    out = collections.defaultdict(list)
    for (name, sm), reports in lines.items():
        out[(key(name), sm)] += reports
    return {entry: sorted(reports) for entry, reports in out.items()}


def without_smem(reports):
    return reports and [[re.sub(r", \d+ bytes smem", "", line) for line in r] for r in reports]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rename", action="append", default=[], metavar="FROM=TO")
    args = parser.parse_args()
    before, after = args.before, args.after
    renames = [tuple(r.split("=", 1)) for r in args.rename]
    failed, counts = False, collections.Counter()
    for arch in ("compute_90a", "compute_90"):
        b, a = cubin_functions(before, arch, renames), cubin_functions(after, arch, renames)
        for name in sorted(set(b) | set(a)):
            counts[arch] += 1
            if name not in a or name not in b:
                print("%s only %s: %s" % (arch, "before" if name in b else "after", name))
                failed = True
                continue
            if len(b[name]) != len(a[name]):
                print("%s compiled %d times before, %d after: %s" %
                      (arch, len(b[name]), len(a[name]), name))
                failed = True
                continue
            fields = ("code", "relocations", "attributes")
            instances = lambda v, f: sorted(repr(x[f]) for x in v)  # noqa: E731
            differs = [f for f in fields if instances(b[name], f) != instances(a[name], f)]
            if differs:
                print("%s CODE DIFFERS (%s): %s" % (arch, ", ".join(differs), name))
                failed = True
            shared = [sorted(repr(x["shared"]) for x in v) for v in (b[name], a[name])]
            if shared[0] != shared[1]:
                print("%s shared memory section (size, alignment) %s -> %s: %s" %
                      (arch, ", ".join(shared[0]), ", ".join(shared[1]), name))
    b, a = ptxas_reports(before, renames), ptxas_reports(after, renames)
    for entry in sorted(set(b) | set(a)):
        x, y = b.get(entry), a.get(entry)
        if x == y:
            continue
        print("ptxas %s: %s -> %s: %s" % (entry[1], x, y, entry[0]))
        failed = failed or without_smem(x) != without_smem(y)
    print("%s functions of sm_90a, %s of sm_90, %d ptxas entries compared: %s" %
          (counts["compute_90a"], counts["compute_90"], len(set(b) | set(a)),
           "the code differs" if failed else "identical code"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
