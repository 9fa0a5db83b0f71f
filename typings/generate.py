"""Regenerate the type stubs of ``rocketmq.grpc_protocol`` (rocketmq-python-client ships its
protobuf modules without stubs): ``python typings/generate.py`` with mypy-protobuf installed
(``pip install mypy-protobuf``; only this script needs it, mypy reads the stubs it wrote).

The package ships no .proto files, so the request to the ``protoc-gen-mypy`` and
``protoc-gen-mypy_grpc`` plugins is built from the descriptors compiled into the ``_pb2``
modules: the stubs describe exactly the installed messages. The modules import each other as
``rocketmq.grpc_protocol.X``, so the stubs' bare ``import X_pb2`` lines are rewritten to match.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2
from google.protobuf.descriptor import FileDescriptor
from rocketmq.grpc_protocol import definition_pb2, service_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "rocketmq", "grpc_protocol")
PACKAGE = "rocketmq.grpc_protocol"
# the stubs this project imports (rmq_spark uses these three modules only)
WANTED = {"definition_pb2.pyi", "service_pb2.pyi", "service_pb2_grpc.pyi"}


def request() -> plugin_pb2.CodeGeneratorRequest:
    req = plugin_pb2.CodeGeneratorRequest()
    seen: set[str] = set()

    def add(fd: FileDescriptor) -> None:
        if fd.name in seen:
            return
        for dep in fd.dependencies:
            add(dep)
        seen.add(fd.name)
        proto = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(proto)
        req.proto_file.append(proto)

    for module in (definition_pb2, service_pb2):
        add(module.DESCRIPTOR)
        req.file_to_generate.append(module.DESCRIPTOR.name)
    return req


def run(plugin: str, req: plugin_pb2.CodeGeneratorRequest) -> None:
    exe = shutil.which(plugin, path=os.path.dirname(sys.executable)) or shutil.which(plugin)
    if exe is None:
        sys.exit(f"{plugin} not found: pip install mypy-protobuf")
    done = subprocess.run([exe], input=req.SerializeToString(), capture_output=True, check=True)
    resp = plugin_pb2.CodeGeneratorResponse()
    resp.ParseFromString(done.stdout)
    if resp.error:
        sys.exit(f"{plugin}: {resp.error}")
    for f in resp.file:
        name = os.path.basename(f.name)
        if name not in WANTED:
            continue
        text = re.sub(
            r"^import (\w+_pb2) as ", rf"from {PACKAGE} import \1 as ", f.content, flags=re.M
        )
        with open(os.path.join(OUT, name), "w") as out:
            out.write(text)
        print("wrote", os.path.relpath(os.path.join(OUT, name), HERE))


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    req = request()
    run("protoc-gen-mypy", req)
    run("protoc-gen-mypy_grpc", req)
