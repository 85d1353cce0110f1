#!/usr/bin/python3
"""Runs the runnable blocks of README.md and docs/*.md against an installed build, and checks
every link between those pages.

    /usr/bin/python3 tests/docs/run_doc_blocks.py --build BUILD --source SOURCE_ROOT

What it does:
  1. Checks each Markdown link of README.md and docs/*.md outside code: a relative link must
     name a file or folder of the source tree, and an anchor (`page.md#anchor`, `#anchor`) a
     heading of that page, as GitHub makes anchors (lowercased, punctuation removed, spaces
     to hyphens). Links to other sites are not followed.
  2. Installs BUILD into a temporary prefix (`cmake --install BUILD --prefix TMP/prefix`).
  3. Runs every fenced block whose info string is `sh runnable`, `python runnable` or
     `cpp runnable`, reporting each as PASS or FAIL with its file and line (and the output of
     a failure).

The convention for blocks:
  - The blocks of one file run in the order they appear, all in one temporary folder of that
    file, outside the source tree (the folder is each block's working directory). A block may
    use what an earlier block of its file wrote there: a manifest, a server's pid file. Once
    a block fails, the later blocks of its file are skipped.
  - `sh`: run by `bash -euo pipefail` with TMP/prefix/bin first on PATH (so `parasol` is the
    installed program). A process a block leaves running in the background (a shard started
    with `&`) is stopped with SIGTERM, then SIGKILL, once every block of its file has run.
  - `python`: run by /usr/bin/python3 with PYTHONPATH set to the folder of the installed
    package (where `_parasol*.so` is found under the prefix), and with neither PARASOL_BIN
    set nor the prefix on PATH (PATH is /usr/bin:/bin): the package must find the installed
    `parasol` program next to itself.
  - `cpp`: written to main.cc beside a CMakeLists.txt that does find_package(Parasol REQUIRED)
    and links Parasol::client, configured with -DCMAKE_PREFIX_PATH=TMP/prefix, built, and run
    (no arguments) in the file's folder.
  - Each block has a time limit (--timeout seconds to run; a C++ block's build has
    --build-timeout more). A manifest a block writes should use 127.0.0.1 and a free port.

Exits 0 when every link resolves and every block passed; 1 otherwise, and also when no
runnable block was found at all.
"""

import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

LANGS = ("sh", "python", "cpp")
FENCE = re.compile(r"^(`{3,}|~{3,})\s*(.*)$")
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CMAKELISTS = """cmake_minimum_required(VERSION 3.25)
project(doc_block LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(Parasol REQUIRED)
add_executable(main main.cc)
target_link_libraries(main PRIVATE Parasol::client)
"""


def pages(source):
    found = [os.path.join(source, "README.md")] + sorted(glob.glob(os.path.join(source, "docs", "*.md")))
    return [p for p in found if os.path.isfile(p)]


def github_anchor(heading):
    """The anchor GitHub gives a heading: lowercased, punctuation removed, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def prose_lines(text):
    """(line number, line) of every line outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
                continue
            if line.strip().startswith(fence) and not m.group(2):
                fence = None
                continue
        if fence is None:
            yield n, line


def anchors_of(path, cache={}):
    if path not in cache:
        seen, out = {}, set()
        with open(path, encoding="utf-8") as f:
            for _, line in prose_lines(f.read()):
                m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
                if m:
                    a = github_anchor(m.group(1))
                    k = seen.get(a, 0)
                    out.add(a if k == 0 else f"{a}-{k}")
                    seen[a] = k + 1
        cache[path] = out
    return cache[path]


def check_links(source):
    """Every broken link as 'file:line: why'; and how many links were checked."""
    errors, count = [], 0
    root = os.path.realpath(source)
    for page in pages(source):
        rel_page = os.path.relpath(page, source)
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for n, line in prose_lines(text):
            line = re.sub(r"`[^`]*`", "", line)  # links inside code spans are not links
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                count += 1
                path, _, anchor = target.partition("#")
                where = f"{rel_page}:{n}: link '{target}'"
                dest = os.path.realpath(os.path.join(os.path.dirname(page), path)) if path else page
                if not (dest == root or dest.startswith(root + os.sep)):
                    errors.append(f"{where} leaves the source tree")
                    continue
                if not os.path.exists(dest):
                    errors.append(f"{where}: no such file")
                    continue
                if anchor:
                    if not dest.endswith(".md") or os.path.isdir(dest):
                        errors.append(f"{where}: an anchor into something other than a Markdown page")
                    elif anchor not in anchors_of(dest):
                        errors.append(f"{where}: no heading with anchor '#{anchor}' in "
                                      f"{os.path.relpath(dest, source)}")
    return errors, count


def runnable_blocks(source):
    """(page, line, language, code) of every runnable block, in file order."""
    blocks = []
    for page in pages(source):
        with open(page, encoding="utf-8") as f:
            lines = f.read().split("\n")
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            fence, info = m.group(1), m.group(2).split()
            start = i + 1
            j = start
            while j < len(lines) and not (lines[j].strip().startswith(fence) and
                                          not lines[j].strip()[len(fence):].strip()):
                j += 1
            if "runnable" in info[1:]:
                if not info or info[0] not in LANGS:
                    raise SystemExit(f"{os.path.relpath(page, source)}:{i + 1}: a runnable block "
                                     f"must be one of {', '.join(LANGS)}, not '{' '.join(info)}'")
                blocks.append((page, i + 1, info[0], "\n".join(lines[start:j]) + "\n"))
            i = j + 1
    return blocks


class Runner:
    def __init__(self, prefix, module_dir, timeout, build_timeout, tmp):
        self.prefix, self.module_dir, self.tmp = prefix, module_dir, tmp
        self.timeout, self.build_timeout = timeout, build_timeout
        self.groups = []  # process groups of this file's blocks, stopped after its last block
        base = {k: v for k, v in os.environ.items() if k not in ("PARASOL_BIN", "PYTHONPATH")}
        self.sh_env = dict(base, PATH=os.path.join(prefix, "bin") + os.pathsep + base.get("PATH", "/usr/bin:/bin"))
        self.py_env = dict(base, PATH="/usr/bin:/bin", PYTHONPATH=module_dir or "")
        self.cxx_env = dict(base)
        self.generator = ["-G", "Ninja"] if shutil.which("ninja") else []

    def call(self, argv, cwd, env, timeout):
        """(exit code or None on time-out, output)."""
        p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        self.groups.append(p.pid)
        try:
            out, _ = p.communicate(timeout=timeout)
            return p.returncode, out.decode(errors="replace")
        except subprocess.TimeoutExpired:
            self.stop_group(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            return None, out.decode(errors="replace") + f"\n[timed out after {timeout} s]"

    @staticmethod
    def stop_group(pgid, sig):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop_leftovers(self):
        alive = []
        for g in self.groups:
            try:
                os.killpg(g, signal.SIGTERM)
                alive.append(g)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 10
        for g in alive:
            while time.monotonic() < deadline:
                try:
                    os.killpg(g, 0)
                except (ProcessLookupError, PermissionError):
                    break
                time.sleep(0.05)
            else:
                self.stop_group(g, signal.SIGKILL)
        self.groups = []

    def run(self, lang, code, folder, name):
        if lang == "sh":
            path = os.path.join(folder, f".{name}.sh")
            with open(path, "w") as f:
                f.write(code)
            return self.call(["bash", "-euo", "pipefail", path], folder, self.sh_env, self.timeout)
        if lang == "python":
            if not self.module_dir:
                return 1, "the Python module is not installed (no _parasol*.so under the prefix)"
            path = os.path.join(folder, f".{name}.py")
            with open(path, "w") as f:
                f.write(code)
            return self.call(["/usr/bin/python3", path], folder, self.py_env, self.timeout)
        project = os.path.join(self.tmp, "cpp", name)
        os.makedirs(project)
        with open(os.path.join(project, "main.cc"), "w") as f:
            f.write(code)
        with open(os.path.join(project, "CMakeLists.txt"), "w") as f:
            f.write(CMAKELISTS)
        build = os.path.join(project, "build")
        log = ""
        for argv in (["cmake", "-S", project, "-B", build, *self.generator,
                      f"-DCMAKE_PREFIX_PATH={self.prefix}"],
                     ["cmake", "--build", build, "-j", "2"]):
            rc, out = self.call(argv, project, self.cxx_env, self.build_timeout)
            log += out
            if rc != 0:
                return rc if rc is not None else None, log + f"\n[{' '.join(argv[:2])} failed]"
        rc, out = self.call([os.path.join(build, "main")], folder, self.sh_env, self.timeout)
        return rc, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="the CMake build folder to install")
    ap.add_argument("--source", required=True, help="the source root (README.md, docs/)")
    ap.add_argument("--timeout", type=int, default=90, help="seconds each block may run")
    ap.add_argument("--build-timeout", type=int, default=300, help="seconds a C++ block may build")
    ap.add_argument("--links-only", action="store_true", help="check the links, run nothing")
    args = ap.parse_args()
    source = os.path.realpath(args.source)
    build = os.path.realpath(args.build)
    started = time.monotonic()
    failed = 0

    errors, count = check_links(source)
    for e in errors:
        print("FAIL link", e)
    print(f"links: {count} checked, {len(errors)} broken")
    failed += len(errors)
    if count == 0:
        print("FAIL: no links found between the pages")
        failed += 1

    blocks = runnable_blocks(source)
    if not blocks:
        print("FAIL: no runnable blocks in README.md or docs/*.md")
        return 1
    if args.links_only:
        return 1 if failed else 0

    tmp = tempfile.mkdtemp(prefix="parasol-docs-")
    if os.path.realpath(tmp).startswith(source + os.sep):
        print(f"FAIL: the temporary folder {tmp} is inside the source tree")
        return 1
    runner = None
    try:
        prefix = os.path.join(tmp, "prefix")
        install = subprocess.run(["cmake", "--install", build, "--prefix", prefix],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if install.returncode != 0 or not os.path.isfile(os.path.join(prefix, "bin", "parasol")):
            print("FAIL: cmake --install did not install bin/parasol")
            print(install.stdout.decode(errors="replace"))
            return 1
        modules = sorted(glob.glob(os.path.join(prefix, "**", "_parasol*.so"), recursive=True))
        module_dir = os.path.dirname(os.path.dirname(modules[0])) if modules else None
        runner = Runner(prefix, module_dir, args.timeout, args.build_timeout, tmp)

        tally = {lang: [0, 0] for lang in LANGS}  # lang: [passed, ran]
        skipped = 0
        by_page = {}
        for b in blocks:
            by_page.setdefault(b[0], []).append(b)
        for page, page_blocks in by_page.items():
            rel = os.path.relpath(page, source)
            folder = os.path.join(tmp, "pages", rel.replace(os.sep, "_").replace(".md", ""))
            os.makedirs(folder)
            broken = None
            for _, line, lang, code in page_blocks:
                where = f"{rel}:{line}"
                if broken:
                    print(f"SKIP {where} ({lang}): {broken} failed before it")
                    skipped += 1
                    continue
                t0 = time.monotonic()
                rc, out = runner.run(lang, code, folder, f"{lang}-{line}")
                seconds = time.monotonic() - t0
                tally[lang][1] += 1
                if rc == 0:
                    tally[lang][0] += 1
                    print(f"PASS {where} ({lang}, {seconds:.1f} s)")
                else:
                    failed += 1
                    broken = where
                    why = "timed out" if rc is None else f"exit {rc}"
                    print(f"FAIL {where} ({lang}, {why}, {seconds:.1f} s); its output:")
                    print("    " + out.rstrip().replace("\n", "\n    "))
            runner.stop_leftovers()
        ran = ", ".join(f"{lang} {p}/{n}" for lang, (p, n) in tally.items())
        print(f"blocks passed: {ran}; skipped {skipped}; {time.monotonic() - started:.1f} s in all")
    finally:
        if runner:
            runner.stop_leftovers()
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
