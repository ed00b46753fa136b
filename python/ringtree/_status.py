"""Communicator.status(): what a communicator found at set-up and has counted since, in one object."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Status:
    """One snapshot of a communicator (read it between calls: the counters move during them)."""

    transports: tuple
    """Per rank, how this rank reaches it ('self', 'shm' or 'tcp')."""
    hosts: str
    """The hosts as the data path sees them, e.g. '2 hosts; {0,1} {2,3}' (ranks that share memory)."""
    wait_policy: str
    """How this rank waits for its peers (spin, yield, then block) and the counts that decided it
    (ranks on this host; ranks on this kernel allowed the same CPUs, which includes other
    containers and network namespaces). A wait on nothing but TCP blocks at once, and one whose
    peer last waited on this CPU skips the spin."""
    single_copy: str
    """'on ...' when large messages of all_gather, all_to_all, broadcast and scatter between
    ranks on this host are read straight from the sender's memory (process_vm_readv); else
    'off' and the reason, and they are copied twice, through shared memory."""
    numa: str
    """This rank's NUMA node and where the shared memory it reads was placed (each rank allocates
    the rings it reads on its own node)."""
    numa_nodes: tuple
    """Each rank's node as this rank knows it; -1 for another host, or not reported."""
    shm_stores: str
    """Which stores this rank's shared-memory writers use (its one-shot slots, its ring to each
    local peer) and, under RINGTREE_SHM_STREAM_STORES=auto, the measured costs behind it."""
    machine: dict
    """The cost model's figures, rank 0's and shared by every rank; source (measured, cached,
    defaults), call_us, hop_us, switch_us, copy and reduce GB/s in and out of cache, cache sizes,
    cores, local_ranks, any_tcp, tcp_hop_us, tcp_GBps, hosts."""
    algo_hook: bool
    """Whether a hook (Communicator.set_algo_hook) makes auto's last decision."""
    cuda_executor: str
    """How CUDA buffers move; 'ipc', 'staged' and why not ipc, or 'not set up' before the first
    call on CUDA buffers."""
    shared_cpu_waits: int
    """Waits that went straight to yielding because a peer they needed was last seen on this rank's
    CPU."""
    single_copy_messages: int
    """Messages this rank has received single-copy."""
    streamed_pieces: int
    """Ring pieces this rank wrote with streaming (cache-bypassing) stores."""
    broadcast_asks_root: tuple
    """Broadcasts of at least the first and fewer than the second of these bytes first ask their
    root whether it holds the buffer mostly on huge pages, and run the flat tree ('direct') if
    so, where ranks outnumber cores (see single_copy); both are 0 where none does."""

    @classmethod
    def of(cls, core: dict, cuda_executor: str) -> Status:
        """From the core's status dict and the CUDA executor's description."""
        return cls(
            transports=tuple(core["transports"]),
            hosts=core["hosts"],
            wait_policy=core["wait_policy"],
            single_copy=core["single_copy"],
            numa=core["numa"],
            numa_nodes=tuple(core["numa_nodes"]),
            shm_stores=core["shm_stores"],
            machine=dict(core["machine"]),
            algo_hook=core["algo_hook"],
            cuda_executor=cuda_executor,
            shared_cpu_waits=core["shared_cpu_waits"],
            single_copy_messages=core["single_copy_messages"],
            streamed_pieces=core["streamed_pieces"],
            broadcast_asks_root=tuple(core["broadcast_asks_root"]),
        )

    def __str__(self):
        m = self.machine
        return "\n".join(
            [
                f"hosts: {self.hosts}; transports: {', '.join(f'{q}:{t}' for q, t in enumerate(self.transports))}",
                f"waiting: {self.wait_policy}",
                f"single copy: {self.single_copy}",
                f"NUMA: {self.numa}; ranks' nodes {list(self.numa_nodes)}",
                f"shared-memory stores: {self.shm_stores}",
                f"cost model ({m['source']}): call {m['call_us']:.2f} us, hop {m['hop_us']:.2f} us, "
                f"switch {m['switch_us']:.2f} us; algo hook {'set' if self.algo_hook else 'none'}",
                f"CUDA: {self.cuda_executor}",
                f"counters: {self.shared_cpu_waits} waits yielded to a peer on this CPU, "
                f"{self.single_copy_messages} single-copy messages, {self.streamed_pieces} streamed pieces",
            ]
        )
