"""ringtree: ring and tree collectives for distributed training.

import ringtree as rt
comm = rt.init()
comm.all_reduce(x)
"""

from __future__ import annotations

from ._args import ANY_SOURCE, ANY_TAG, default_timeout
from ._buffers import DTYPES
from ._choice import ChoiceRequest
from ._core import Aborted, BootstrapError, CollectiveMismatch, Error, InvalidArgument, PeerFailure, Timeout, UniqueId
from ._grouped import Group, Request
from ._nccl import nccl_info
from ._status import Status
from ._work import MessageWork, Work
from ._world import cuda_available, dump, init, join, trace
from .bucketing import Bucketer
from .collectives import CollectiveInfo, collective_info
from .comm import Communicator
from .elastic import Excluded
from .explain import explain
from .ops import PremulSum, ReduceOp, premul_sum

__all__ = [
    "init",
    "Communicator",
    "Work",
    "Bucketer",
    "UniqueId",
    "ReduceOp",
    "PremulSum",
    "premul_sum",
    "Error",
    "InvalidArgument",
    "Timeout",
    "PeerFailure",
    "CollectiveMismatch",
    "Aborted",
    "BootstrapError",
    "DTYPES",
    "default_timeout",
    "explain",
    "nccl_info",
    "cuda_available",
    "collective_info",
    "CollectiveInfo",
    "dump",
    "trace",
    "MessageWork",
    "ANY_SOURCE",
    "ANY_TAG",
    "Excluded",
    "join",
    "Status",
    "ChoiceRequest",
    "Group",
    "Request",
]
__version__ = "0.1.0"
