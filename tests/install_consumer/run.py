#!/usr/bin/env python3
"""The install test: `cmake --install` kvmesh into a scratch prefix, build
tests/install_consumer against it with find_package(kvmesh), start a
coordinator and a node from the installed `kvmesh` binary on free loopback
ports, and run the consumer (C++ NetworkClient) and the C example against
them. Everything it starts is killed and its scratch folder removed, pass or
fail.

Usage: run.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# Bounds grow with the build (sanitizers: KVMESH_TEST_TIME_SCALE, cmake/KvmeshHelpers.cmake).
SCALE = int(os.environ.get('KVMESH_TEST_TIME_SCALE', '1'))
DEADLINE_S = 240 * SCALE


def run(cmd, **kw):
    print('+', ' '.join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def read_event(proc, timeout_s):
    """The daemon's {"event":"listening",...} line."""
    end = time.time() + timeout_s
    os.set_blocking(proc.stdout.fileno(), False)
    buf = b''
    while time.time() < end:
        chunk = proc.stdout.read()
        if chunk:
            buf += chunk
            for line in buf.split(b'\n'):
                if line.startswith(b'{'):
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if ev.get('event') == 'listening':
                        return ev
        elif proc.poll() is not None:
            break
        time.sleep(0.02)
    raise RuntimeError(f'no listening event from pid {proc.pid} (exit {proc.poll()})')


def main():
    build, source = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    scratch = tempfile.mkdtemp(prefix='kvmesh-install-')
    procs = []
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

        kvmesh = os.path.join(prefix, 'bin', 'kvmesh')
        config = os.path.join(source, 'cluster_configs', 'daemons-local.json')
        coord = subprocess.Popen([kvmesh, 'coordinator', '--config', config, '--port', '0'],
                                 stdout=subprocess.PIPE, start_new_session=True)
        procs.append(coord)
        ev = read_event(coord, 30 * SCALE)
        address = f'{ev["host"]}:{ev["ports"]["http"]}'
        node = subprocess.Popen([kvmesh, 'node', '--config', config, '--id', 'n0', '--coordinator', address],
                                stdout=subprocess.PIPE, start_new_session=True)
        procs.append(node)
        read_event(node, 30 * SCALE)
        left = max(10, DEADLINE_S - (time.time() - start))
        run([os.path.join(cbuild, 'consumer'), address], timeout=left)
        run([os.path.join(cbuild, 'consumer_c'), address], timeout=left, stdout=subprocess.DEVNULL)
        print('install consumer: OK')
        return 0
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
