import datetime

from diffusion.v1 import common_pb2 as _common_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrainingJobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAINING_JOB_STATE_UNSPECIFIED: _ClassVar[TrainingJobState]
    TRAINING_JOB_STATE_PENDING: _ClassVar[TrainingJobState]
    TRAINING_JOB_STATE_RUNNING: _ClassVar[TrainingJobState]
    TRAINING_JOB_STATE_SUCCEEDED: _ClassVar[TrainingJobState]
    TRAINING_JOB_STATE_FAILED: _ClassVar[TrainingJobState]
    TRAINING_JOB_STATE_CANCELLED: _ClassVar[TrainingJobState]
    TRAINING_JOB_STATE_SUSPENDED: _ClassVar[TrainingJobState]

class TrainingPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAINING_PHASE_UNSPECIFIED: _ClassVar[TrainingPhase]
    TRAINING_PHASE_VALIDATING: _ClassVar[TrainingPhase]
    TRAINING_PHASE_WAITING_FOR_GPU: _ClassVar[TrainingPhase]
    TRAINING_PHASE_ENCODING_TEXT: _ClassVar[TrainingPhase]
    TRAINING_PHASE_CACHING_LATENTS: _ClassVar[TrainingPhase]
    TRAINING_PHASE_LOADING_TRANSFORMER: _ClassVar[TrainingPhase]
    TRAINING_PHASE_QUANTIZING: _ClassVar[TrainingPhase]
    TRAINING_PHASE_COMPILING: _ClassVar[TrainingPhase]
    TRAINING_PHASE_TRAINING: _ClassVar[TrainingPhase]
    TRAINING_PHASE_SAVING: _ClassVar[TrainingPhase]
    TRAINING_PHASE_PUBLISHING: _ClassVar[TrainingPhase]
    TRAINING_PHASE_DOWNLOADING: _ClassVar[TrainingPhase]
    TRAINING_PHASE_YIELDING: _ClassVar[TrainingPhase]

class StopMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_MODE_UNSPECIFIED: _ClassVar[StopMode]
    STOP_MODE_SAVE: _ClassVar[StopMode]
    STOP_MODE_DISCARD: _ClassVar[StopMode]

class Optimizer(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPTIMIZER_UNSPECIFIED: _ClassVar[Optimizer]
    OPTIMIZER_ADAMW: _ClassVar[Optimizer]
    OPTIMIZER_ADAMW_8BIT: _ClassVar[Optimizer]

class LrSchedule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LR_SCHEDULE_UNSPECIFIED: _ClassVar[LrSchedule]
    LR_SCHEDULE_CONSTANT: _ClassVar[LrSchedule]
    LR_SCHEDULE_CONSTANT_WITH_WARMUP: _ClassVar[LrSchedule]
    LR_SCHEDULE_LINEAR: _ClassVar[LrSchedule]
    LR_SCHEDULE_COSINE: _ClassVar[LrSchedule]
TRAINING_JOB_STATE_UNSPECIFIED: TrainingJobState
TRAINING_JOB_STATE_PENDING: TrainingJobState
TRAINING_JOB_STATE_RUNNING: TrainingJobState
TRAINING_JOB_STATE_SUCCEEDED: TrainingJobState
TRAINING_JOB_STATE_FAILED: TrainingJobState
TRAINING_JOB_STATE_CANCELLED: TrainingJobState
TRAINING_JOB_STATE_SUSPENDED: TrainingJobState
TRAINING_PHASE_UNSPECIFIED: TrainingPhase
TRAINING_PHASE_VALIDATING: TrainingPhase
TRAINING_PHASE_WAITING_FOR_GPU: TrainingPhase
TRAINING_PHASE_ENCODING_TEXT: TrainingPhase
TRAINING_PHASE_CACHING_LATENTS: TrainingPhase
TRAINING_PHASE_LOADING_TRANSFORMER: TrainingPhase
TRAINING_PHASE_QUANTIZING: TrainingPhase
TRAINING_PHASE_COMPILING: TrainingPhase
TRAINING_PHASE_TRAINING: TrainingPhase
TRAINING_PHASE_SAVING: TrainingPhase
TRAINING_PHASE_PUBLISHING: TrainingPhase
TRAINING_PHASE_DOWNLOADING: TrainingPhase
TRAINING_PHASE_YIELDING: TrainingPhase
STOP_MODE_UNSPECIFIED: StopMode
STOP_MODE_SAVE: StopMode
STOP_MODE_DISCARD: StopMode
OPTIMIZER_UNSPECIFIED: Optimizer
OPTIMIZER_ADAMW: Optimizer
OPTIMIZER_ADAMW_8BIT: Optimizer
LR_SCHEDULE_UNSPECIFIED: LrSchedule
LR_SCHEDULE_CONSTANT: LrSchedule
LR_SCHEDULE_CONSTANT_WITH_WARMUP: LrSchedule
LR_SCHEDULE_LINEAR: LrSchedule
LR_SCHEDULE_COSINE: LrSchedule

class GetTrainingInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FamilyTrainingInfo(_message.Message):
    __slots__ = ("family", "precision_modes", "recommended_precision", "supports_compile", "default_resolution", "default_rank", "default_alpha", "default_learning_rate", "default_steps", "memory_note")
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    PRECISION_MODES_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDED_PRECISION_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_COMPILE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_RANK_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_ALPHA_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_STEPS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_NOTE_FIELD_NUMBER: _ClassVar[int]
    family: _common_pb2.Family
    precision_modes: _containers.RepeatedScalarFieldContainer[_common_pb2.Precision]
    recommended_precision: _common_pb2.Precision
    supports_compile: bool
    default_resolution: int
    default_rank: int
    default_alpha: float
    default_learning_rate: float
    default_steps: int
    memory_note: str
    def __init__(self, family: _Optional[_Union[_common_pb2.Family, str]] = ..., precision_modes: _Optional[_Iterable[_Union[_common_pb2.Precision, str]]] = ..., recommended_precision: _Optional[_Union[_common_pb2.Precision, str]] = ..., supports_compile: _Optional[bool] = ..., default_resolution: _Optional[int] = ..., default_rank: _Optional[int] = ..., default_alpha: _Optional[float] = ..., default_learning_rate: _Optional[float] = ..., default_steps: _Optional[int] = ..., memory_note: _Optional[str] = ...) -> None: ...

class GetTrainingInfoResponse(_message.Message):
    __slots__ = ("families", "cpu_only", "optimizers", "adamw_8bit_unavailable_reason")
    FAMILIES_FIELD_NUMBER: _ClassVar[int]
    CPU_ONLY_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZERS_FIELD_NUMBER: _ClassVar[int]
    ADAMW_8BIT_UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    families: _containers.RepeatedCompositeFieldContainer[FamilyTrainingInfo]
    cpu_only: bool
    optimizers: _containers.RepeatedScalarFieldContainer[Optimizer]
    adamw_8bit_unavailable_reason: str
    def __init__(self, families: _Optional[_Iterable[_Union[FamilyTrainingInfo, _Mapping]]] = ..., cpu_only: _Optional[bool] = ..., optimizers: _Optional[_Iterable[_Union[Optimizer, str]]] = ..., adamw_8bit_unavailable_reason: _Optional[str] = ...) -> None: ...

class Dataset(_message.Message):
    __slots__ = ("image_dir", "instance_prompt", "aspect_ratio_buckets")
    IMAGE_DIR_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    ASPECT_RATIO_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    image_dir: str
    instance_prompt: str
    aspect_ratio_buckets: bool
    def __init__(self, image_dir: _Optional[str] = ..., instance_prompt: _Optional[str] = ..., aspect_ratio_buckets: _Optional[bool] = ...) -> None: ...

class StartTrainingRequest(_message.Message):
    __slots__ = ("family", "base", "dataset", "base_precision", "rank", "alpha", "learning_rate", "steps", "batch_size", "resolution", "optimizer", "lr_schedule", "warmup_steps", "gradient_checkpointing", "seed", "checkpoint_every", "sample_every", "sample_prompts", "adapter_id", "trigger_words", "resume_job_id", "priority", "speed_mode", "gradient_accumulation_steps", "device_index", "gradient_checkpointing_interval")
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    BASE_PRECISION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    LR_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    WARMUP_STEPS_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_CHECKPOINTING_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_EVERY_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_WORDS_FIELD_NUMBER: _ClassVar[int]
    RESUME_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SPEED_MODE_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_ACCUMULATION_STEPS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_CHECKPOINTING_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    family: _common_pb2.Family
    base: _common_pb2.ModelSource
    dataset: Dataset
    base_precision: _common_pb2.Precision
    rank: int
    alpha: float
    learning_rate: float
    steps: int
    batch_size: int
    resolution: int
    optimizer: Optimizer
    lr_schedule: LrSchedule
    warmup_steps: int
    gradient_checkpointing: bool
    seed: int
    checkpoint_every: int
    sample_every: int
    sample_prompts: _containers.RepeatedScalarFieldContainer[str]
    adapter_id: str
    trigger_words: _containers.RepeatedScalarFieldContainer[str]
    resume_job_id: str
    priority: int
    speed_mode: _common_pb2.SpeedMode
    gradient_accumulation_steps: int
    device_index: int
    gradient_checkpointing_interval: int
    def __init__(self, family: _Optional[_Union[_common_pb2.Family, str]] = ..., base: _Optional[_Union[_common_pb2.ModelSource, _Mapping]] = ..., dataset: _Optional[_Union[Dataset, _Mapping]] = ..., base_precision: _Optional[_Union[_common_pb2.Precision, str]] = ..., rank: _Optional[int] = ..., alpha: _Optional[float] = ..., learning_rate: _Optional[float] = ..., steps: _Optional[int] = ..., batch_size: _Optional[int] = ..., resolution: _Optional[int] = ..., optimizer: _Optional[_Union[Optimizer, str]] = ..., lr_schedule: _Optional[_Union[LrSchedule, str]] = ..., warmup_steps: _Optional[int] = ..., gradient_checkpointing: _Optional[bool] = ..., seed: _Optional[int] = ..., checkpoint_every: _Optional[int] = ..., sample_every: _Optional[int] = ..., sample_prompts: _Optional[_Iterable[str]] = ..., adapter_id: _Optional[str] = ..., trigger_words: _Optional[_Iterable[str]] = ..., resume_job_id: _Optional[str] = ..., priority: _Optional[int] = ..., speed_mode: _Optional[_Union[_common_pb2.SpeedMode, str]] = ..., gradient_accumulation_steps: _Optional[int] = ..., device_index: _Optional[int] = ..., gradient_checkpointing_interval: _Optional[int] = ...) -> None: ...

class StartTrainingResponse(_message.Message):
    __slots__ = ("job_id", "job")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    job: TrainingJob
    def __init__(self, job_id: _Optional[str] = ..., job: _Optional[_Union[TrainingJob, _Mapping]] = ...) -> None: ...

class WatchTrainingRequest(_message.Message):
    __slots__ = ("job_id", "from_sequence")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    from_sequence: int
    def __init__(self, job_id: _Optional[str] = ..., from_sequence: _Optional[int] = ...) -> None: ...

class WatchTrainingResponse(_message.Message):
    __slots__ = ("sequence", "time", "job_id", "resolved", "phase", "step", "checkpoint", "sample", "warning", "finished")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    WARNING_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    time: _timestamp_pb2.Timestamp
    job_id: str
    resolved: TrainingResolved
    phase: TrainingPhaseChanged
    step: TrainingStep
    checkpoint: CheckpointSaved
    sample: TrainingSample
    warning: TrainingWarning
    finished: TrainingFinished
    def __init__(self, sequence: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., job_id: _Optional[str] = ..., resolved: _Optional[_Union[TrainingResolved, _Mapping]] = ..., phase: _Optional[_Union[TrainingPhaseChanged, _Mapping]] = ..., step: _Optional[_Union[TrainingStep, _Mapping]] = ..., checkpoint: _Optional[_Union[CheckpointSaved, _Mapping]] = ..., sample: _Optional[_Union[TrainingSample, _Mapping]] = ..., warning: _Optional[_Union[TrainingWarning, _Mapping]] = ..., finished: _Optional[_Union[TrainingFinished, _Mapping]] = ...) -> None: ...

class TrainingResolved(_message.Message):
    __slots__ = ("resolved",)
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    resolved: _containers.RepeatedCompositeFieldContainer[_common_pb2.ResolvedSetting]
    def __init__(self, resolved: _Optional[_Iterable[_Union[_common_pb2.ResolvedSetting, _Mapping]]] = ...) -> None: ...

class TrainingPhaseChanged(_message.Message):
    __slots__ = ("phase", "message")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    phase: TrainingPhase
    message: str
    def __init__(self, phase: _Optional[_Union[TrainingPhase, str]] = ..., message: _Optional[str] = ...) -> None: ...

class TrainingStep(_message.Message):
    __slots__ = ("step", "total_steps", "loss", "avg_loss", "learning_rate", "grad_norm", "samples_per_second", "peak_memory_bytes", "elapsed", "eta", "yielded", "peak_reserved_bytes")
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    AVG_LOSS_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_FIELD_NUMBER: _ClassVar[int]
    ETA_FIELD_NUMBER: _ClassVar[int]
    YIELDED_FIELD_NUMBER: _ClassVar[int]
    PEAK_RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    step: int
    total_steps: int
    loss: float
    avg_loss: float
    learning_rate: float
    grad_norm: float
    samples_per_second: float
    peak_memory_bytes: int
    elapsed: _duration_pb2.Duration
    eta: _duration_pb2.Duration
    yielded: _duration_pb2.Duration
    peak_reserved_bytes: int
    def __init__(self, step: _Optional[int] = ..., total_steps: _Optional[int] = ..., loss: _Optional[float] = ..., avg_loss: _Optional[float] = ..., learning_rate: _Optional[float] = ..., grad_norm: _Optional[float] = ..., samples_per_second: _Optional[float] = ..., peak_memory_bytes: _Optional[int] = ..., elapsed: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., eta: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., yielded: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., peak_reserved_bytes: _Optional[int] = ...) -> None: ...

class CheckpointSaved(_message.Message):
    __slots__ = ("step", "path")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    step: int
    path: str
    def __init__(self, step: _Optional[int] = ..., path: _Optional[str] = ...) -> None: ...

class TrainingSample(_message.Message):
    __slots__ = ("step", "prompt", "png")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PNG_FIELD_NUMBER: _ClassVar[int]
    step: int
    prompt: str
    png: bytes
    def __init__(self, step: _Optional[int] = ..., prompt: _Optional[str] = ..., png: _Optional[bytes] = ...) -> None: ...

class TrainingWarning(_message.Message):
    __slots__ = ("reason", "message")
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    reason: str
    message: str
    def __init__(self, reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class TrainingFinished(_message.Message):
    __slots__ = ("state", "adapter_id", "steps_completed", "message")
    STATE_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    STEPS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    state: TrainingJobState
    adapter_id: str
    steps_completed: int
    message: str
    def __init__(self, state: _Optional[_Union[TrainingJobState, str]] = ..., adapter_id: _Optional[str] = ..., steps_completed: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class TrainingJob(_message.Message):
    __slots__ = ("job_id", "state", "family", "request", "steps_completed", "total_steps", "last_sequence", "adapter_id", "create_time", "update_time", "error", "train_time", "owner")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    STEPS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TRAIN_TIME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: TrainingJobState
    family: _common_pb2.Family
    request: StartTrainingRequest
    steps_completed: int
    total_steps: int
    last_sequence: int
    adapter_id: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    error: str
    train_time: _duration_pb2.Duration
    owner: str
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[_Union[TrainingJobState, str]] = ..., family: _Optional[_Union[_common_pb2.Family, str]] = ..., request: _Optional[_Union[StartTrainingRequest, _Mapping]] = ..., steps_completed: _Optional[int] = ..., total_steps: _Optional[int] = ..., last_sequence: _Optional[int] = ..., adapter_id: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[str] = ..., train_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., owner: _Optional[str] = ...) -> None: ...

class StopTrainingRequest(_message.Message):
    __slots__ = ("job_id", "mode")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    mode: StopMode
    def __init__(self, job_id: _Optional[str] = ..., mode: _Optional[_Union[StopMode, str]] = ...) -> None: ...

class StopTrainingResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: TrainingJob
    def __init__(self, job: _Optional[_Union[TrainingJob, _Mapping]] = ...) -> None: ...

class GetTrainingJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetTrainingJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: TrainingJob
    def __init__(self, job: _Optional[_Union[TrainingJob, _Mapping]] = ...) -> None: ...

class ListTrainingJobsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTrainingJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[TrainingJob]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[TrainingJob, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteTrainingJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class DeleteTrainingJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: TrainingJob
    def __init__(self, job: _Optional[_Union[TrainingJob, _Mapping]] = ...) -> None: ...

class ListAdaptersRequest(_message.Message):
    __slots__ = ("family", "page_size", "page_token")
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    family: _common_pb2.Family
    page_size: int
    page_token: str
    def __init__(self, family: _Optional[_Union[_common_pb2.Family, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class Adapter(_message.Message):
    __slots__ = ("adapter_id", "family", "base", "rank", "alpha", "steps", "resolution", "trigger_words", "job_id", "create_time", "size_bytes", "owner")
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_WORDS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    family: _common_pb2.Family
    base: str
    rank: int
    alpha: float
    steps: int
    resolution: int
    trigger_words: _containers.RepeatedScalarFieldContainer[str]
    job_id: str
    create_time: _timestamp_pb2.Timestamp
    size_bytes: int
    owner: str
    def __init__(self, adapter_id: _Optional[str] = ..., family: _Optional[_Union[_common_pb2.Family, str]] = ..., base: _Optional[str] = ..., rank: _Optional[int] = ..., alpha: _Optional[float] = ..., steps: _Optional[int] = ..., resolution: _Optional[int] = ..., trigger_words: _Optional[_Iterable[str]] = ..., job_id: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., size_bytes: _Optional[int] = ..., owner: _Optional[str] = ...) -> None: ...

class ListAdaptersResponse(_message.Message):
    __slots__ = ("adapters", "next_page_token")
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    adapters: _containers.RepeatedCompositeFieldContainer[Adapter]
    next_page_token: str
    def __init__(self, adapters: _Optional[_Iterable[_Union[Adapter, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteAdapterRequest(_message.Message):
    __slots__ = ("adapter_id",)
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    def __init__(self, adapter_id: _Optional[str] = ...) -> None: ...

class DeleteAdapterResponse(_message.Message):
    __slots__ = ("adapter",)
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    adapter: Adapter
    def __init__(self, adapter: _Optional[_Union[Adapter, _Mapping]] = ...) -> None: ...
