"""ringtree and its peers behind one interface, so the driver times them alike.

An implementation turns (collective, placement, buffers, op, root) into a zero-argument
callable that runs the collective once; all argument conversion (torch views, MPI
datatypes, op objects) happens in make_call, outside the timed loop.

Peers run in the same processes on the same numpy buffers as ringtree:
  mpi     mpi4py over whichever MPI it loads (MPICH, Open MPI); needs mpiexec
  gloo    torch.distributed Gloo, initialised from a TCP store on a free port
  nccl    torch.distributed NCCL; needs --device cuda and one GPU per rank
  memcpy  numpy.copyto in one process (rank 0): the copy bandwidth of the machine; with
          --device cuda, a device-to-device torch copy_ instead
  raw     plain TCP sockets in a ring (bench/raw_socket.py): every rank sends the bytes the
          collective's busbw factor says it must move to the next rank while receiving as many
          from the previous one; no header, no reduction, from and into one 1 MiB buffer that
          stays in cache: the link's best for those bytes
  rawbuf  the same from the cell's input and into its output buffer (what a collective must
          touch: cold memory at large sizes)
With --device cuda, mpi and gloo are absent (they take host buffers).
A peer that cannot run is reported absent with the reason, never silently dropped.
"""

from __future__ import annotations

import datetime
import os
import sys
import warnings

import numpy as np

from .collectives import IP, OOP, Collective

# Environment variables that mark a process started by an MPI launcher.
_MPI_LAUNCH_ENV = (
    "PMI_RANK",
    "PMI_SIZE",
    "PMIX_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "MPI_LOCALRANKID",
    "HYDI_CONTROL_FD",
    "MV2_COMM_WORLD_SIZE",
)


def launcher_name(env=os.environ) -> str:
    if "RINGTREE_RANK" in env:
        return "ringtree.launch"
    if any(k in env for k in _MPI_LAUNCH_ENV):
        return "mpiexec"
    if "TORCHELASTIC_RUN_ID" in env or ("LOCAL_RANK" in env and "RANK" in env):
        return "torchrun"
    return "none (one rank)"


class Impl:
    """Base: a named implementation measured in given placements."""

    name = "?"
    is_subject = False  # ringtree itself: its #wrong decides the exit code
    rank0_only = False  # memcpy: runs in one process, others wait
    checked = True  # False: moves bytes without computing the collective (raw sockets)

    def placements(self, coll: Collective) -> tuple[str, ...]:
        raise NotImplementedError

    def unsupported(self, coll: Collective, dtype_name: str, op: str | None) -> str | None:
        """A reason when this (collective, dtype, op) cannot run here, else None."""
        return None

    def make_call(self, coll, placement, inp, out, n, op, root):
        raise NotImplementedError

    def barrier(self):
        raise NotImplementedError

    # Exceptions that mean "cannot do this cell" rather than a broken run.
    skippable: tuple = ()

    def close(self):
        pass


class RingtreeImpl(Impl):
    is_subject = True

    def __init__(self, rt, comm, algo: str | None, timeout: float | None, persistent=False, group=0, coalesced=False):
        self.rt, self.comm, self.algo = rt, comm, algo
        self.name = f"ringtree:{algo}" if algo else "ringtree:p2p"
        self.timeout = timeout
        # --persistent: each cell's call is planned once and started; --group N: N calls per group,
        # with --coalesced as one list call.
        self.persistent, self.group, self.coalesced = persistent, group, coalesced
        self.skippable = tuple(getattr(rt, n) for n in ("InvalidArgument",) if hasattr(rt, n)) + (NotImplementedError,)

    def placements(self, coll):
        if coll.name == "broadcast":
            return (IP,)  # ringtree's broadcast is in place only
        if coll.name == "sendrecv":
            return (OOP,)  # one buffer cannot be sent and received at once
        return (OOP, IP)

    def barrier(self):
        self.comm.barrier()

    def make_call(self, coll, placement, inp, out, n, op, root):
        if self.persistent:
            try:
                if self.group:  # one persistent group of N calls
                    call = self.make_plain_call(coll, placement, inp, out, n, op, root)
                    with self.comm.group(persistent=True) as group:
                        for _ in range(self.group):
                            call()
                    return group.request.start
                return self.make_request(coll, placement, inp, out, op, root).start
            except self.skippable as exc:  # raised where a plain call would raise it: at the call

                def rejected(exc=exc):
                    raise exc

                return rejected
        if self.group and placement == IP and coll.name == "reduce_scatter":

            def aliased():  # each call's output is part of the next one's input: they compound
                raise NotImplementedError("--group: in-place reduce_scatters on one buffer read each other's results")

            return aliased
        if self.coalesced:
            return self.make_coalesced_call(coll, placement, inp, out, op)
        call = self.make_plain_call(coll, placement, inp, out, n, op, root)
        if self.group < 1:
            return call
        c, calls = self.comm, range(self.group)

        def grouped():
            with c.group():
                for _ in calls:
                    call()

        return grouped

    def make_coalesced_call(self, coll, placement, inp, out, op):
        # The group's N calls on the same buffers, as --group issues them, in one list call.
        c, name, n = self.comm, coll.name, self.group
        algo, timeout = self.algo or "auto", self.timeout
        xs, outs = [inp] * n, [out] * n
        if name == "all_reduce":
            outs = None if placement == IP else outs
            return lambda: c.all_reduce_coalesced(xs, outs, op=op, algo=algo, timeout=timeout)
        if name == "reduce_scatter":
            return lambda: c.reduce_scatter_coalesced(xs, outs, op=op, algo=algo, timeout=timeout)
        if name == "all_gather":
            return lambda: c.all_gather_coalesced(xs, outs, algo=algo, timeout=timeout)

        def rejected():
            raise NotImplementedError(f"{name} has no coalesced form (--coalesced)")

        return rejected

    def make_request(self, coll, placement, inp, out, op, root):
        c, name = self.comm, coll.name
        kw = dict(algo=self.algo or "auto", timeout=self.timeout)
        ip = placement == IP
        if name == "all_reduce":
            return c.all_reduce_init(inp, None if ip else out, op=op, **kw)
        if name == "reduce_scatter":
            return c.reduce_scatter_init(inp, out, op=op, **kw)
        if name in ("all_gather", "all_to_all"):
            return getattr(c, name + "_init")(inp, out, **kw)
        if name == "broadcast":
            return c.broadcast_init(inp, root=root, **kw)
        if name == "reduce":
            return c.reduce_init(inp, None if ip else out, root=root, op=op, **kw)
        if name in ("gather", "scatter"):
            return getattr(c, name + "_init")(inp, out, root=root, **kw)
        if name == "sendrecv":
            return c.sendrecv_init(inp, (c.rank + 1) % c.size, out, (c.rank - 1) % c.size, timeout=self.timeout)
        raise ValueError(name)

    def make_plain_call(self, coll, placement, inp, out, n, op, root):
        # Keywords written out, not **kwargs: unpacking a dict per call costs more in Python
        # (~0.4 us) than a small collective's traffic, a cost users calling by keyword never pay.
        c, name = self.comm, coll.name
        algo = self.algo or "auto"
        timeout = self.timeout
        ip = placement == IP
        if name == "all_reduce":
            if ip:
                return lambda: c.all_reduce(inp, op=op, algo=algo, timeout=timeout)
            return lambda: c.all_reduce(inp, out, op=op, algo=algo, timeout=timeout)
        if name == "reduce_scatter":
            return lambda: c.reduce_scatter(inp, out, op=op, algo=algo, timeout=timeout)
        if name == "all_gather":
            return lambda: c.all_gather(inp, out, algo=algo, timeout=timeout)
        if name == "all_to_all":
            return lambda: c.all_to_all(inp, out, algo=algo, timeout=timeout)
        if name == "broadcast":
            return lambda: c.broadcast(inp, root=root, algo=algo, timeout=timeout)
        if name == "reduce":
            if ip:
                return lambda: c.reduce(inp, root=root, op=op, algo=algo, timeout=timeout)
            return lambda: c.reduce(inp, out=out, root=root, op=op, algo=algo, timeout=timeout)
        if name == "gather":
            return lambda: c.gather(inp, out=out, root=root, algo=algo, timeout=timeout)
        if name == "scatter":
            return lambda: c.scatter(inp, out, root=root, algo=algo, timeout=timeout)
        if name == "sendrecv":
            nxt, prv = (c.rank + 1) % c.size, (c.rank - 1) % c.size

            # One grouped call, like nccl-tests' ncclGroupStart/Send/Recv/ncclGroupEnd: calls on a
            # communicator run in order, so a separate send and recv would stall a ring once a
            # message outgrows the shared-memory ring.
            return lambda: c.sendrecv(inp, nxt, out, prv)
        raise ValueError(name)


# ---------------------------------------------------------------------------- MPI


class MpiImpl(Impl):
    name = "mpi"

    def __init__(self, MPI, comm, description):
        self.MPI, self.comm, self.description = MPI, comm, description
        self.skippable = (MPI.Exception,)
        null = MPI.DATATYPE_NULL

        def real(t):
            return None if t is None or t == null else t

        self.types = {
            "int8": MPI.INT8_T,
            "uint8": MPI.UINT8_T,
            "int32": MPI.INT32_T,
            "int64": MPI.INT64_T,
            "float32": MPI.FLOAT,
            "float64": MPI.DOUBLE,
            "float16": real(getattr(MPI, "FLOAT16_T", None)),
            "bfloat16": real(getattr(MPI, "BFLOAT16_T", None)),
        }
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

    def placements(self, coll):
        return (IP,) if coll.name == "broadcast" else (OOP,)

    def unsupported(self, coll, dtype_name, op):
        if self.types.get(dtype_name) is None:
            return f"this MPI has no {dtype_name} datatype"
        if coll.reduction and op not in self.ops:
            return f"MPI has no {op} reduction"
        return None

    def barrier(self):
        self.comm.Barrier()

    def make_call(self, coll, placement, inp, out, n, op, root):
        c, name = self.comm, coll.name
        mpi_type = self.types[inp.dtype.name]

        def spec(arr):
            # 16-bit floats travel as raw bits: mpi4py cannot read their buffer format.
            raw = arr.view(np.uint16) if arr.dtype.itemsize == 2 and arr.dtype.kind not in "iu" else arr
            return [raw, arr.size, mpi_type]

        s, r = spec(inp), spec(out)
        mop = self.ops.get(op)
        if name == "all_reduce":
            return lambda: c.Allreduce(s, r, mop)
        if name == "reduce_scatter":
            return lambda: c.Reduce_scatter_block([s[0], n, mpi_type], r, mop)
        if name == "all_gather":
            return lambda: c.Allgather(s, [r[0], n, mpi_type])
        if name == "all_to_all":
            return lambda: c.Alltoall([s[0], n, mpi_type], [r[0], n, mpi_type])
        if name == "broadcast":
            return lambda: c.Bcast(s, root)
        if name == "reduce":
            return lambda: c.Reduce(s, r, mop, root)
        if name == "gather":
            return lambda: c.Gather(s, [r[0], n, mpi_type], root)
        if name == "scatter":
            return lambda: c.Scatter([s[0], n, mpi_type], r, root)
        if name == "sendrecv":
            nxt, prv = (c.rank + 1) % c.size, (c.rank - 1) % c.size
            return lambda: c.Sendrecv(s, nxt, 0, r, prv, 0)
        raise ValueError(name)

    def close(self):
        self.comm.Free()


def open_mpi(rank, nranks):
    """(MpiImpl, None) or (None, reason)."""
    if launcher_name() != "mpiexec":
        return None, ("not started by mpiexec; run `mpiexec -n P python bench/rt_bench.py ...` to compare with MPI")
    try:
        from mpi4py import MPI
    except ImportError as exc:
        return None, f"mpi4py not installed ({exc}); pip install mpi4py mpich"
    world = MPI.COMM_WORLD
    if world.Get_size() != nranks:
        return None, f"MPI world has {world.Get_size()} ranks, ringtree {nranks}"
    comm = world.Split(0, rank)  # number MPI ranks as ringtree's, whatever the launcher did
    # Its name and version: "MPICH Version: 5.0.2", "Open MPI v5.0.11", "Intel(R) MPI Library 2021.18.1".
    first = (MPI.Get_library_version().strip().splitlines() or [""])[0]
    lib = " ".join(first.split(",")[0].split(" for ")[0].split())
    import mpi4py

    return MpiImpl(MPI, comm, f"{lib} via mpi4py {mpi4py.__version__}"), None


# ---------------------------------------------------------------------------- torch


def _torch_view(torch, arr):
    """A tensor sharing arr's memory (bfloat16 goes through its 16-bit pattern); device
    tensors (--device cuda) are used as they are."""
    if isinstance(arr, torch.Tensor):
        return arr
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


_TORCH_MEASURED = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64")


class TorchImpl(Impl):
    """torch.distributed with one backend (gloo here; nccl once buffers live on GPUs)."""

    def __init__(self, name, torch, dist, description):
        self.name, self.torch, self.dist, self.description = name, torch, dist, description
        self.skippable = (RuntimeError, ValueError, NotImplementedError)
        R = dist.ReduceOp
        self.ops = {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX, "avg": R.AVG}

    def placements(self, coll):
        # torch's all_reduce, reduce and broadcast work in place only.
        return (IP,) if coll.name in ("all_reduce", "reduce", "broadcast") else (OOP,)

    def unsupported(self, coll, dtype_name, op):
        if dtype_name not in _TORCH_MEASURED:
            return f"not measured with {dtype_name} (torch.distributed runs the first eight dtypes here)"
        if coll.reduction and op == "avg" and not dtype_name.startswith("float") and dtype_name != "bfloat16":
            return "torch.distributed AVG needs a floating dtype"
        if coll.name == "sendrecv" and self.dist.get_world_size() == 1:
            return "Gloo cannot send to its own rank"
        return None

    def barrier(self):
        self.dist.barrier()

    def make_call(self, coll, placement, inp, out, n, op, root):
        dist, name = self.dist, coll.name
        tin, tout = _torch_view(self.torch, inp), _torch_view(self.torch, out)
        rop = self.ops.get(op)
        size, rank = dist.get_world_size(), dist.get_rank()
        if name == "all_reduce":
            return lambda: dist.all_reduce(tin, op=rop)
        # torch 2.13 marks these names deprecated; its warnings would land in the result tables.
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
        if name == "reduce_scatter":
            return lambda: dist.reduce_scatter_tensor(tout, tin, op=rop)
        if name == "all_gather":
            return lambda: dist.all_gather_into_tensor(tout, tin)
        if name == "all_to_all":
            return lambda: dist.all_to_all_single(tout, tin)
        if name == "broadcast":
            return lambda: dist.broadcast(tin, src=root)
        if name == "reduce":
            return lambda: dist.reduce(tin, dst=root, op=rop)
        if name == "gather":
            blocks = [tout[b * n : (b + 1) * n] for b in range(size)] if rank == root else None
            return lambda: dist.gather(tin, gather_list=blocks, dst=root)
        if name == "scatter":
            blocks = [tin[b * n : (b + 1) * n] for b in range(size)] if rank == root else None
            return lambda: dist.scatter(tout, scatter_list=blocks, src=root)
        if name == "sendrecv":
            nxt, prv = (rank + 1) % size, (rank - 1) % size

            def sendrecv():
                work = dist.isend(tin, nxt)
                dist.recv(tout, prv)
                work.wait()

            return sendrecv
        raise ValueError(name)

    def close(self):
        self.dist.destroy_process_group()


def _import_torch():
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return None, None, f"torch not installed ({exc}); pip install torch==2.13.0"
    if not dist.is_available():
        return None, None, "this torch build has no torch.distributed"
    return torch, dist, None


def open_gloo(rank, nranks, share_port, timeout_s):
    """share_port(port_or_minus_1) -> rank 0's value on every rank (a ringtree broadcast)."""
    torch, dist, reason = _import_torch()
    if reason is None and not dist.is_gloo_available():
        reason = "this torch build has no Gloo"
    return _open_torch_backend("gloo", torch, dist, reason, rank, nranks, share_port, timeout_s)


def _open_torch_backend(backend, torch, dist, reason, rank, nranks, share_port, timeout_s):
    """A torch.distributed process group for the peer `backend`, rendezvousing through a TCP
    store rank 0 opens; `reason` (why it cannot run here) must agree on every rank."""
    if reason is None and dist.is_initialized():
        reason = "a torch.distributed process group already exists in this process"
    # Every rank must agree before touching the store, or rank 0 would wait alone.
    port = -1
    store = None
    if rank == 0 and reason is None:
        try:
            store = dist.TCPStore(
                _store_host(), 0, nranks, True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s)
            )
            port = store.port
        except Exception as exc:  # any failure to listen makes this peer absent on all ranks
            reason = f"cannot start a TCP store: {exc}"
    port = share_port(port if reason is None else -1)
    if port < 0:
        return None, reason or f"{backend} could not start on another rank"
    if _store_host().startswith("127.") and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # the host name may not resolve to loopback
    if store is None:
        store = dist.TCPStore(_store_host(), port, nranks, False, timeout=datetime.timedelta(seconds=timeout_s))
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=nranks, timeout=datetime.timedelta(seconds=timeout_s)
    )
    if backend == "nccl":
        version = ".".join(str(v) for v in torch.cuda.nccl.version())
        return TorchImpl("nccl", torch, dist, f"torch {torch.__version__} NCCL {version}"), None
    return TorchImpl(backend, torch, dist, f"torch {torch.__version__} Gloo"), None


def _store_host():
    return os.environ.get("MASTER_ADDR", "127.0.0.1")


def open_nccl(rank, nranks, share_port, device, timeout_s):
    torch, dist, reason = _import_torch()
    if reason is None and device != "cuda":
        reason = "needs --device cuda (GPU buffers)"
    if reason is None and not torch.cuda.is_available():
        reason = "no GPU"
    if reason is None and not dist.is_nccl_available():
        reason = "this torch build has no NCCL"
    if reason is None and torch.cuda.device_count() < nranks:
        reason = f"NCCL needs one GPU per rank: {nranks} ranks, {torch.cuda.device_count()} GPU(s) here"
    return _open_torch_backend("nccl", torch, dist, reason, rank, nranks, share_port, timeout_s)


# ---------------------------------------------------------------------------- memcpy


class MemcpyImpl(Impl):
    """One process copying size bytes: the machine's copy bandwidth, busbw = algbw."""

    name = "memcpy"
    rank0_only = True
    description = "numpy.copyto of the same number of bytes, rank 0 alone"

    def __init__(self):
        self.src = self.dst = np.zeros(0, dtype=np.uint8)

    def reserve(self, nbytes):
        if self.src.size < nbytes:
            self.src = np.ones(nbytes, dtype=np.uint8)
            self.dst = np.zeros(nbytes, dtype=np.uint8)

    def placements(self, coll):
        return (OOP,)

    def make_call(self, coll, placement, inp, out, n, op, root):
        nbytes = max(inp.nbytes, out.nbytes)
        self.reserve(nbytes)
        src, dst = self.src[:nbytes], self.dst[:nbytes]
        return lambda: np.copyto(dst, src)

    def barrier(self):
        pass


class DeviceCopyImpl(MemcpyImpl):
    """--device cuda: one device-to-device copy of size bytes (torch copy_), rank 0 alone."""

    description = "torch device-to-device copy_ of the same number of bytes, rank 0 alone"

    def __init__(self):
        import torch

        self.torch = torch
        self.src = self.dst = torch.zeros(0, dtype=torch.uint8, device="cuda")

    def reserve(self, nbytes):
        if self.src.numel() < nbytes:
            self.src = self.torch.ones(nbytes, dtype=self.torch.uint8, device="cuda")
            self.dst = self.torch.zeros(nbytes, dtype=self.torch.uint8, device="cuda")

    def make_call(self, coll, placement, inp, out, n, op, root):
        nbytes = max(inp.numel() * inp.element_size(), out.numel() * out.element_size())
        self.reserve(nbytes)
        src, dst = self.src[:nbytes], self.dst[:nbytes]
        return lambda: dst.copy_(src)


# ---------------------------------------------------------------------------- raw sockets


class RawSocketImpl(Impl):
    """The bytes a ring moves, over plain TCP: send busbw_factor x size bytes to rank+1 while
    receiving as many from rank-1, from the cell's own buffers (not checked: no reduction)."""

    name = "raw"
    checked = False
    description = "plain TCP sockets in a ring, busbw-factor x size bytes each way, no reduction"

    def __init__(self, exchange, nranks, own_buffers: bool):
        self.ex, self.nranks, self.own_buffers = exchange, nranks, own_buffers
        if not own_buffers:
            self.name = "rawbuf"
            self.description += ", from and into the cell's buffers"

    def placements(self, coll):
        return (IP,)

    def make_call(self, coll, placement, inp, out, n, op, root):
        nbytes = int(coll.busbw_factor(self.nranks) * max(inp.nbytes, out.nbytes))
        src = dst = None  # the exchange's own cache-resident buffer
        if not self.own_buffers:
            src = memoryview(inp.reshape(-1).view(np.uint8))
            dst = memoryview(out.reshape(-1).view(np.uint8))
        return lambda: self.ex.run(nbytes, src, dst)

    def barrier(self):
        self.ex.run(1)  # a token round the ring

    def close(self):
        self.ex.close()


def open_raw(rank, nranks, gather_ints, timeout_s, own_buffers=True):
    """(RawSocketImpl, None) or (None, reason). Every rank listens on the address it reaches the
    store (MASTER_ADDR) from; addresses and ports travel through ringtree (gather_ints)."""
    import ipaddress
    import socket

    import raw_socket

    if nranks < 2:
        return None, "needs two ranks or more"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((_store_host(), 9))  # no packet is sent: this only picks the route
        my_ip = probe.getsockname()[0]
    finally:
        probe.close()
    sockbuf, streams = int(os.environ.get("RAW_SOCKBUF", 0)), int(os.environ.get("RAW_STREAMS", 1))
    zerocopy = os.environ.get("RAW_ZEROCOPY", "0") == "1"
    server = raw_socket.listen(my_ip, 0, sockbuf)
    try:
        ips = gather_ints(int(ipaddress.IPv4Address(my_ip)))
        ports = gather_ints(server.getsockname()[1])
        nxt = (rank + 1) % nranks
        out, inc = raw_socket.ring_sockets(
            server, (str(ipaddress.IPv4Address(int(ips[nxt]))), int(ports[nxt])), streams, sockbuf, zerocopy, timeout_s
        )
    finally:
        server.close()
    impl = RawSocketImpl(raw_socket.Exchange(out, inc, zerocopy, 1 << 20), nranks, own_buffers)
    impl.description += f" (streams={streams}, sockbuf={sockbuf or 'kernel'}, zerocopy={int(zerocopy)})"
    return impl, None


def open_peers(names, rank, nranks, share_port, device, timeout_s, gather_ints=None):
    """Open each requested peer: (list of Impl, {name: description}, {name: absence reason})."""
    opened, described, absent = [], {}, {}
    for name in names:
        if name in ("mpi", "gloo") and device == "cuda":
            impl, reason = None, "takes host buffers only (this run is --device cuda)"
        elif name == "mpi":
            impl, reason = open_mpi(rank, nranks)
        elif name == "gloo":
            impl, reason = open_gloo(rank, nranks, share_port, timeout_s)
        elif name == "nccl":
            impl, reason = open_nccl(rank, nranks, share_port, device, timeout_s)
        elif name == "memcpy":
            impl, reason = (DeviceCopyImpl() if device == "cuda" else MemcpyImpl()), None
        elif name in ("raw", "rawbuf"):
            impl, reason = (
                open_raw(rank, nranks, gather_ints, timeout_s, name == "raw")
                if device != "cuda"
                else (None, "host sockets only (this run is --device cuda)")
            )
        else:
            raise ValueError(name)
        if impl is None:
            absent[name] = reason
        else:
            opened.append(impl)
            described[name] = impl.description
    return opened, described, absent


def eprint(*args):
    print(*args, file=sys.stderr, flush=True)
