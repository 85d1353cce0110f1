#!/usr/bin/env python3
"""Prints why each skipped test skipped, from ctest's log of the last run.

ctest lists a skipped test only as "(Skipped)"; its reason is in its output, which ctest keeps in
Testing/Temporary/LastTest.log. For a GoogleTest test that is the message after "Skipped" (what
GTEST_SKIP() was given); for a script, the last lines it printed.

    skip_reasons.py BUILD_DIR CTEST_OUTPUT_FILE
"""
import os
import re
import sys


def skipped_names(ctest_output):
    names = []
    for line in ctest_output.splitlines():
        m = re.match(r"\s*\d+ - (.+) \(Skipped\)\s*$", line)
        if m:
            names.append(m.group(1))
    return names


def outputs(log):
    """Each test's output in LastTest.log, by name."""
    found = {}
    for m in re.finditer(r'^"(?P<name>[^"\n]+)" start time:.*?\nOutput:\n-+\n(?P<out>.*?)<end of output>',
                         log, re.S | re.M):
        found[m.group("name")] = m.group("out")
    return found


def reason(output):
    lines = [l.rstrip() for l in output.splitlines() if l.strip()]
    for i, line in enumerate(lines):
        if re.search(r": Skipped$", line):  # GoogleTest: the message follows
            rest = []
            for l in lines[i + 1:]:
                if l.startswith("[  SKIPPED ]") or l.startswith("[       OK ]"):
                    break
                rest.append(l)
            return " ".join(rest) or "(GTEST_SKIP without a message)"
    return " / ".join(lines[-3:]) if lines else "(no output)"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    build, ctest_file = sys.argv[1], sys.argv[2]
    with open(ctest_file, errors="replace") as f:
        names = skipped_names(f.read())
    if not names:
        return
    log_path = os.path.join(build, "Testing", "Temporary", "LastTest.log")
    try:
        with open(log_path, errors="replace") as f:
            by_name = outputs(f.read())
    except OSError as e:
        print("skipped tests: cannot read %s: %s" % (log_path, e))
        return
    print("Why the skipped tests skipped:")
    for name in names:
        out = by_name.get(name)
        print("  %s: %s" % (name, reason(out) if out is not None else "(not in LastTest.log)"))


if __name__ == "__main__":
    main()
