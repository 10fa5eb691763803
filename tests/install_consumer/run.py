#!/usr/bin/env python3
"""The install test: `cmake --install` kvmesh into a scratch prefix, build
tests/install_consumer against it with find_package(kvmesh), start a
coordinator and a node from the installed `kvmesh` binary on free loopback
ports, and run the consumer (C++ NetworkClient) and the C example against
them. Everything it starts is killed and its scratch folder removed, pass or
fail.

Usage: run.py BUILD_DIR SOURCE_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launch import Daemons, scaled  # noqa: E402  (tests/launch.py: the daemons' launcher)

# Bounds grow with the build (sanitizers: KVMESH_TEST_TIME_SCALE, cmake/KvmeshHelpers.cmake).
DEADLINE_S = scaled(240)


def run(cmd, **kw):
    print('+', ' '.join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def main():
    build, source = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    scratch = tempfile.mkdtemp(prefix='kvmesh-install-')
    daemons = None
    start = time.time()
    try:
        prefix = os.path.join(scratch, 'prefix')
        run(['cmake', '--install', build, '--prefix', prefix], stdout=subprocess.DEVNULL)
        for must in ['bin/kvmesh', 'include/kvmesh/network.h', 'include/kvmesh/build_config.h']:
            if not os.path.exists(os.path.join(prefix, must)):
                raise RuntimeError(f'install lacks {must}')
        # Only the public API is installed: no internal header came along.
        for d in ['shard_node', 'transport', 'router', 'common']:
            if os.path.exists(os.path.join(prefix, 'include', d)):
                raise RuntimeError(f'install holds internal headers: include/{d}')
        cbuild = os.path.join(scratch, 'consumer')
        gen = ['-G', 'Ninja'] if shutil.which('ninja') else []
        run(['cmake', '-S', os.path.join(source, 'tests', 'install_consumer'), '-B', cbuild, *gen,
             f'-DCMAKE_PREFIX_PATH={prefix}', f'-DKVMESH_C_EXAMPLE={os.path.join(source, "examples", "c_client.c")}'],
            stdout=subprocess.DEVNULL)
        run(['cmake', '--build', cbuild], stdout=subprocess.DEVNULL)

        # A coordinator and n0 of the installed kvmesh (bounds scaled by the launcher).
        daemons = Daemons(config=os.path.join(source, 'cluster_configs', 'daemons-local.json'), nodes=('n0',),
                          binary=os.path.join(prefix, 'bin', 'kvmesh'), timeout_s=30)
        address = daemons.start().address
        left = max(10, DEADLINE_S - (time.time() - start))
        run([os.path.join(cbuild, 'consumer'), address], timeout=left)
        run([os.path.join(cbuild, 'consumer_c'), address], timeout=left, stdout=subprocess.DEVNULL)
        print('install consumer: OK')
        return 0
    finally:
        if daemons is not None:
            daemons.kill_all()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
