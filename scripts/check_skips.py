#!/usr/bin/python3
"""Lists every skip of a CTest run with its reason, and fails on a skip this machine should not
need.

    check_skips.py JUNIT_XML [ALLOWED_SKIPS]

JUNIT_XML is what `ctest --output-junit` wrote (with --test-output-size-passed large enough to
keep whole outputs). A skip is a test CTest did not run as passed (GoogleTest's GTEST_SKIP, a
script's exit status 77), with the reason its output gives, or a part of a test that printed
"[ PART SKIPPED ] Suite.Test: part: reason" (tests/skip_report.h). Each is printed; each must match
a rule of ALLOWED_SKIPS (default tests/allowed_skips.txt, whose header explains the rules) whose
condition holds here, else the exit status is 1. Python's standard library only.
"""
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PART = re.compile(r"^\[ PART SKIPPED \] (.*)$", re.M)


def whole_test_reason(output):
    """The reason a skipped test printed: GoogleTest's message after '...: Skipped', or a
    script's 'skipped: ...' line."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.endswith(": Skipped"):
            reason = []
            for following in lines[i + 1:]:
                if following.startswith("[  SKIPPED ]"):
                    break
                reason.append(following.strip())
            return " ".join(r for r in reason if r) or "(no reason given)"
    for line in lines:
        if line.lower().startswith("skipped:"):
            return line.split(":", 1)[1].strip()
    return "(no reason printed)"


def skips(junit_path):
    """[(kind, 'Suite.Test: [part: ]reason')] in the order of the run."""
    found = []
    for case in ElementTree.parse(junit_path).getroot().iter("testcase"):
        name = case.get("name").split("  # GetParam()")[0]  # gtest_discover_tests' suffix
        output = case.findtext("system-out") or ""
        if case.find("skipped") is not None:
            found.append(("test", f"{name}: {whole_test_reason(output)}"))
        for part in PART.findall(output):
            found.append(("part", part.strip()))
    return found


def has_gpu():
    nvidia_smi = shutil.which("nvidia-smi")
    if not nvidia_smi:
        return False
    try:
        listed = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def can_mount():
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 21))  # CAP_SYS_ADMIN
    except OSError:
        pass
    return False


def condition_holds(condition):
    """(holds, what was found) for one CONDITION of the rules file."""
    if condition == "always":
        return True, "always accepted"
    if condition == "no-gpu":
        gpu = has_gpu()
        return not gpu, "a GPU is present (nvidia-smi -L)" if gpu else "no GPU here"
    if condition == "cannot-mount":
        mount = can_mount()
        return not mount, "root with CAP_SYS_ADMIN here" if mount else "cannot mount here"
    if condition.startswith("cpu-lacks:"):
        wanted = condition.split(":", 1)[1].split(",")
        present = sorted(set(wanted) & cpu_flags())
        if present:
            return False, "this CPU has " + ", ".join(present)
        return True, "this CPU lacks " + ", ".join(wanted)
    raise ValueError(f"unknown condition {condition!r}")


def read_rules(path):
    rules = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            condition, pattern = line.split(None, 1)
            condition_holds(condition)  # an unknown condition is an error here, not later
            rules.append((condition, re.compile(pattern), f"{os.path.basename(path)}:{number}"))
    return rules


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    rules = read_rules(argv[2] if len(argv) == 3 else
                       os.path.join(ROOT, "tests", "allowed_skips.txt"))
    found = skips(argv[1])
    if not found:
        print("skips: none")
        return 0
    print(f"skips: {len(found)}")
    refused = 0
    for kind, text in found:
        matching = [rule for rule in rules if rule[1].search(text)]
        verdicts = [(condition_holds(c), where) for c, _, where in matching]
        allowed = [where for (holds, _), where in verdicts if holds]
        if allowed:
            print(f"  skipped {kind}: {text}  [allowed: {allowed[0]}]")
            continue
        refused += 1
        why = "; ".join(f"{where}: {found}" for (_, found), where in verdicts) or \
            "no rule in tests/allowed_skips.txt matches it"
        print(f"  skipped {kind}: {text}  [NOT ALLOWED: {why}]")
    if refused:
        print(f"error: {refused} skip(s) this machine should not need: install what they lack "
              "(scripts/bootstrap.sh) or, if the machine cannot run them, add a rule to "
              "tests/allowed_skips.txt", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
