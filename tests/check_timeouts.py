#!/usr/bin/env python3
"""Every ctest test of a build tree has a TIMEOUT property of its own.

A test without one gets the test preset's default timeout (300 s), which does
not grow with KVMESH_TEST_TIMEOUT_SCALE: in a sanitizer build such a test
could fail for time alone. kvmesh_test(), kvmesh_timeout() and
kvmesh_test_bounds() in cmake/KvmeshHelpers.cmake set scaled ones.

Usage: check_timeouts.py BUILD_DIR (exit 1, naming the tests, when one lacks it)
"""
import json
import subprocess
import sys


def main():
    build = sys.argv[1]
    out = subprocess.run(['ctest', '--test-dir', build, '--show-only=json-v1'], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    tests = json.loads(out)['tests']
    missing = []
    for t in tests:
        props = {p['name']: p['value'] for p in t.get('properties', [])}
        if not props.get('TIMEOUT'):
            missing.append(t['name'])
    print(f'{len(tests)} tests, {len(tests) - len(missing)} with a TIMEOUT of their own')
    for name in missing:
        print(f'no TIMEOUT: {name}')
    return 1 if missing else 0


if __name__ == '__main__':
    sys.exit(main())
