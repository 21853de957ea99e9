import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WaitPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAIT_POLICY_UNSPECIFIED: _ClassVar[WaitPolicy]
    WAIT_POLICY_QUEUE: _ClassVar[WaitPolicy]
    WAIT_POLICY_FAIL_FAST: _ClassVar[WaitPolicy]

class ComputeClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPUTE_CLASS_UNSPECIFIED: _ClassVar[ComputeClass]
    COMPUTE_CLASS_INTERACTIVE: _ClassVar[ComputeClass]
    COMPUTE_CLASS_BATCH: _ClassVar[ComputeClass]

class LeaseState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_STATE_UNSPECIFIED: _ClassVar[LeaseState]
    LEASE_STATE_ACTIVE: _ClassVar[LeaseState]
    LEASE_STATE_PREEMPTING: _ClassVar[LeaseState]
    LEASE_STATE_AWAITING_RECLAIM: _ClassVar[LeaseState]

class WaitState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAIT_STATE_UNSPECIFIED: _ClassVar[WaitState]
    WAIT_STATE_QUEUED: _ClassVar[WaitState]
    WAIT_STATE_PREEMPTING: _ClassVar[WaitState]

class TransitionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSITION_KIND_UNSPECIFIED: _ClassVar[TransitionKind]
    TRANSITION_KIND_SNAPSHOT: _ClassVar[TransitionKind]
    TRANSITION_KIND_QUEUED: _ClassVar[TransitionKind]
    TRANSITION_KIND_REJECTED: _ClassVar[TransitionKind]
    TRANSITION_KIND_GRANTED: _ClassVar[TransitionKind]
    TRANSITION_KIND_PREEMPT_REQUESTED: _ClassVar[TransitionKind]
    TRANSITION_KIND_PREEMPT_WITHDRAWN: _ClassVar[TransitionKind]
    TRANSITION_KIND_PREEMPT_DEADLINE_MISSED: _ClassVar[TransitionKind]
    TRANSITION_KIND_RELEASED: _ClassVar[TransitionKind]
    TRANSITION_KIND_HOLDER_LOST: _ClassVar[TransitionKind]
    TRANSITION_KIND_CANCELLED: _ClassVar[TransitionKind]
    TRANSITION_KIND_ABORT_REQUESTED: _ClassVar[TransitionKind]
    TRANSITION_KIND_FAILED: _ClassVar[TransitionKind]
    TRANSITION_KIND_AWAITING_RECLAIM: _ClassVar[TransitionKind]
    TRANSITION_KIND_RECLAIM_EXPIRED: _ClassVar[TransitionKind]
    TRANSITION_KIND_OVER_LEASE: _ClassVar[TransitionKind]
    TRANSITION_KIND_YIELD_REQUESTED: _ClassVar[TransitionKind]
    TRANSITION_KIND_YIELD_WITHDRAWN: _ClassVar[TransitionKind]

class CancelOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANCEL_OUTCOME_UNSPECIFIED: _ClassVar[CancelOutcome]
    CANCEL_OUTCOME_REMOVED_FROM_QUEUE: _ClassVar[CancelOutcome]
    CANCEL_OUTCOME_ABORT_REQUESTED: _ClassVar[CancelOutcome]
WAIT_POLICY_UNSPECIFIED: WaitPolicy
WAIT_POLICY_QUEUE: WaitPolicy
WAIT_POLICY_FAIL_FAST: WaitPolicy
COMPUTE_CLASS_UNSPECIFIED: ComputeClass
COMPUTE_CLASS_INTERACTIVE: ComputeClass
COMPUTE_CLASS_BATCH: ComputeClass
LEASE_STATE_UNSPECIFIED: LeaseState
LEASE_STATE_ACTIVE: LeaseState
LEASE_STATE_PREEMPTING: LeaseState
LEASE_STATE_AWAITING_RECLAIM: LeaseState
WAIT_STATE_UNSPECIFIED: WaitState
WAIT_STATE_QUEUED: WaitState
WAIT_STATE_PREEMPTING: WaitState
TRANSITION_KIND_UNSPECIFIED: TransitionKind
TRANSITION_KIND_SNAPSHOT: TransitionKind
TRANSITION_KIND_QUEUED: TransitionKind
TRANSITION_KIND_REJECTED: TransitionKind
TRANSITION_KIND_GRANTED: TransitionKind
TRANSITION_KIND_PREEMPT_REQUESTED: TransitionKind
TRANSITION_KIND_PREEMPT_WITHDRAWN: TransitionKind
TRANSITION_KIND_PREEMPT_DEADLINE_MISSED: TransitionKind
TRANSITION_KIND_RELEASED: TransitionKind
TRANSITION_KIND_HOLDER_LOST: TransitionKind
TRANSITION_KIND_CANCELLED: TransitionKind
TRANSITION_KIND_ABORT_REQUESTED: TransitionKind
TRANSITION_KIND_FAILED: TransitionKind
TRANSITION_KIND_AWAITING_RECLAIM: TransitionKind
TRANSITION_KIND_RECLAIM_EXPIRED: TransitionKind
TRANSITION_KIND_OVER_LEASE: TransitionKind
TRANSITION_KIND_YIELD_REQUESTED: TransitionKind
TRANSITION_KIND_YIELD_WITHDRAWN: TransitionKind
CANCEL_OUTCOME_UNSPECIFIED: CancelOutcome
CANCEL_OUTCOME_REMOVED_FROM_QUEUE: CancelOutcome
CANCEL_OUTCOME_ABORT_REQUESTED: CancelOutcome

class Holder(_message.Message):
    __slots__ = ("client_id", "purpose", "priority", "pid")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    purpose: str
    priority: int
    pid: int
    def __init__(self, client_id: _Optional[str] = ..., purpose: _Optional[str] = ..., priority: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("holder", "device_index", "memory_bytes", "wait_policy", "release_grace", "reclaim_lease_id", "compute_class")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAIT_POLICY_FIELD_NUMBER: _ClassVar[int]
    RELEASE_GRACE_FIELD_NUMBER: _ClassVar[int]
    RECLAIM_LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CLASS_FIELD_NUMBER: _ClassVar[int]
    holder: Holder
    device_index: int
    memory_bytes: int
    wait_policy: WaitPolicy
    release_grace: _duration_pb2.Duration
    reclaim_lease_id: str
    compute_class: ComputeClass
    def __init__(self, holder: _Optional[_Union[Holder, _Mapping]] = ..., device_index: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., wait_policy: _Optional[_Union[WaitPolicy, str]] = ..., release_grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., reclaim_lease_id: _Optional[str] = ..., compute_class: _Optional[_Union[ComputeClass, str]] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("sequence", "time", "request_id", "queued", "preempting", "granted", "preempt_requested", "preempt_withdrawn", "abort_requested", "released", "yield_requested", "yield_withdrawn")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    PREEMPTING_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    PREEMPT_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    PREEMPT_WITHDRAWN_FIELD_NUMBER: _ClassVar[int]
    ABORT_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    YIELD_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    YIELD_WITHDRAWN_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    time: _timestamp_pb2.Timestamp
    request_id: str
    queued: LeaseQueued
    preempting: LeasePreempting
    granted: Lease
    preempt_requested: PreemptRequested
    preempt_withdrawn: PreemptWithdrawn
    abort_requested: AbortRequested
    released: LeaseReleased
    yield_requested: YieldRequested
    yield_withdrawn: YieldWithdrawn
    def __init__(self, sequence: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., request_id: _Optional[str] = ..., queued: _Optional[_Union[LeaseQueued, _Mapping]] = ..., preempting: _Optional[_Union[LeasePreempting, _Mapping]] = ..., granted: _Optional[_Union[Lease, _Mapping]] = ..., preempt_requested: _Optional[_Union[PreemptRequested, _Mapping]] = ..., preempt_withdrawn: _Optional[_Union[PreemptWithdrawn, _Mapping]] = ..., abort_requested: _Optional[_Union[AbortRequested, _Mapping]] = ..., released: _Optional[_Union[LeaseReleased, _Mapping]] = ..., yield_requested: _Optional[_Union[YieldRequested, _Mapping]] = ..., yield_withdrawn: _Optional[_Union[YieldWithdrawn, _Mapping]] = ...) -> None: ...

class LeaseQueued(_message.Message):
    __slots__ = ("position", "reason")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    position: int
    reason: str
    def __init__(self, position: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class LeasePreempting(_message.Message):
    __slots__ = ("device_index", "victim_lease_ids", "deadline")
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    VICTIM_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    device_index: int
    victim_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    deadline: _timestamp_pb2.Timestamp
    def __init__(self, device_index: _Optional[int] = ..., victim_lease_ids: _Optional[_Iterable[str]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PreemptRequested(_message.Message):
    __slots__ = ("lease_id", "deadline", "for_request_id", "for_holder")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    FOR_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FOR_HOLDER_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    deadline: _timestamp_pb2.Timestamp
    for_request_id: str
    for_holder: Holder
    def __init__(self, lease_id: _Optional[str] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., for_request_id: _Optional[str] = ..., for_holder: _Optional[_Union[Holder, _Mapping]] = ...) -> None: ...

class PreemptWithdrawn(_message.Message):
    __slots__ = ("lease_id", "reason")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    reason: str
    def __init__(self, lease_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class AbortRequested(_message.Message):
    __slots__ = ("lease_id", "reason")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    reason: str
    def __init__(self, lease_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class YieldRequested(_message.Message):
    __slots__ = ("lease_id", "for_lease_id", "for_holder")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FOR_LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FOR_HOLDER_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    for_lease_id: str
    for_holder: Holder
    def __init__(self, lease_id: _Optional[str] = ..., for_lease_id: _Optional[str] = ..., for_holder: _Optional[_Union[Holder, _Mapping]] = ...) -> None: ...

class YieldWithdrawn(_message.Message):
    __slots__ = ("lease_id", "reason")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    reason: str
    def __init__(self, lease_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaseReleased(_message.Message):
    __slots__ = ("lease", "held")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    held: _duration_pb2.Duration
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., held: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "request_id", "holder", "device_index", "memory_bytes", "exclusive", "granted_time", "state", "preempt_deadline", "missed_preempt_deadlines", "granted_priority", "owner", "reclaim_deadline", "compute_class", "busy", "yielding_to_lease_id")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    GRANTED_TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PREEMPT_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    MISSED_PREEMPT_DEADLINES_FIELD_NUMBER: _ClassVar[int]
    GRANTED_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    RECLAIM_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CLASS_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    YIELDING_TO_LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    request_id: str
    holder: Holder
    device_index: int
    memory_bytes: int
    exclusive: bool
    granted_time: _timestamp_pb2.Timestamp
    state: LeaseState
    preempt_deadline: _timestamp_pb2.Timestamp
    missed_preempt_deadlines: int
    granted_priority: int
    owner: str
    reclaim_deadline: _timestamp_pb2.Timestamp
    compute_class: ComputeClass
    busy: bool
    yielding_to_lease_id: str
    def __init__(self, lease_id: _Optional[str] = ..., request_id: _Optional[str] = ..., holder: _Optional[_Union[Holder, _Mapping]] = ..., device_index: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., exclusive: _Optional[bool] = ..., granted_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[LeaseState, str]] = ..., preempt_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., missed_preempt_deadlines: _Optional[int] = ..., granted_priority: _Optional[int] = ..., owner: _Optional[str] = ..., reclaim_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., compute_class: _Optional[_Union[ComputeClass, str]] = ..., busy: _Optional[bool] = ..., yielding_to_lease_id: _Optional[str] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("lease", "held")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    held: _duration_pb2.Duration
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., held: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SetBusyRequest(_message.Message):
    __slots__ = ("lease_id", "busy")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    busy: bool
    def __init__(self, lease_id: _Optional[str] = ..., busy: _Optional[bool] = ...) -> None: ...

class SetBusyResponse(_message.Message):
    __slots__ = ("yielding_lease_ids",)
    YIELDING_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    yielding_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, yielding_lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_id", "lease_id", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    lease_id: str
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("outcome",)
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    outcome: CancelOutcome
    def __init__(self, outcome: _Optional[_Union[CancelOutcome, str]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: BrokerState
    def __init__(self, state: _Optional[_Union[BrokerState, _Mapping]] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("index", "name", "uuid", "total_bytes", "leased_bytes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    LEASED_BYTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    uuid: str
    total_bytes: int
    leased_bytes: int
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., uuid: _Optional[str] = ..., total_bytes: _Optional[int] = ..., leased_bytes: _Optional[int] = ...) -> None: ...

class WaitingRequest(_message.Message):
    __slots__ = ("request_id", "holder", "device_index", "memory_bytes", "state", "position", "arrival_time", "effective_priority", "victim_lease_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_TIME_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    VICTIM_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    holder: Holder
    device_index: int
    memory_bytes: int
    state: WaitState
    position: int
    arrival_time: _timestamp_pb2.Timestamp
    effective_priority: int
    victim_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., holder: _Optional[_Union[Holder, _Mapping]] = ..., device_index: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., state: _Optional[_Union[WaitState, str]] = ..., position: _Optional[int] = ..., arrival_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., effective_priority: _Optional[int] = ..., victim_lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class BrokerState(_message.Message):
    __slots__ = ("devices", "leases", "queue", "sequence")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    queue: _containers.RepeatedCompositeFieldContainer[WaitingRequest]
    sequence: int
    def __init__(self, devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., queue: _Optional[_Iterable[_Union[WaitingRequest, _Mapping]]] = ..., sequence: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ("sequence", "time", "transition", "state")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    TRANSITION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    time: _timestamp_pb2.Timestamp
    transition: Transition
    state: BrokerState
    def __init__(self, sequence: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., transition: _Optional[_Union[Transition, _Mapping]] = ..., state: _Optional[_Union[BrokerState, _Mapping]] = ...) -> None: ...

class Transition(_message.Message):
    __slots__ = ("kind", "request_id", "lease_id", "holder", "device_index", "detail")
    KIND_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    kind: TransitionKind
    request_id: str
    lease_id: str
    holder: Holder
    device_index: int
    detail: str
    def __init__(self, kind: _Optional[_Union[TransitionKind, str]] = ..., request_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., holder: _Optional[_Union[Holder, _Mapping]] = ..., device_index: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...
