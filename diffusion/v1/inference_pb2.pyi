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

class LoadPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOAD_PHASE_UNSPECIFIED: _ClassVar[LoadPhase]
    LOAD_PHASE_VALIDATING: _ClassVar[LoadPhase]
    LOAD_PHASE_WAITING_FOR_GPU: _ClassVar[LoadPhase]
    LOAD_PHASE_DOWNLOADING: _ClassVar[LoadPhase]
    LOAD_PHASE_BUILDING: _ClassVar[LoadPhase]
    LOAD_PHASE_QUANTIZING: _ClassVar[LoadPhase]
    LOAD_PHASE_COMPILING: _ClassVar[LoadPhase]
    LOAD_PHASE_WARMING: _ClassVar[LoadPhase]
    LOAD_PHASE_READY: _ClassVar[LoadPhase]

class GenerationPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GENERATION_PHASE_UNSPECIFIED: _ClassVar[GenerationPhase]
    GENERATION_PHASE_QUEUED: _ClassVar[GenerationPhase]
    GENERATION_PHASE_ENCODING_PROMPT: _ClassVar[GenerationPhase]
    GENERATION_PHASE_DENOISING: _ClassVar[GenerationPhase]
    GENERATION_PHASE_DECODING: _ClassVar[GenerationPhase]
    GENERATION_PHASE_ENCODING_IMAGES: _ClassVar[GenerationPhase]
    GENERATION_PHASE_DONE: _ClassVar[GenerationPhase]

class ImageFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IMAGE_FORMAT_UNSPECIFIED: _ClassVar[ImageFormat]
    IMAGE_FORMAT_PNG: _ClassVar[ImageFormat]
    IMAGE_FORMAT_WEBP: _ClassVar[ImageFormat]
    IMAGE_FORMAT_JPEG: _ClassVar[ImageFormat]
    IMAGE_FORMAT_RAW_RGB8: _ClassVar[ImageFormat]

class DeviceKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEVICE_KIND_UNSPECIFIED: _ClassVar[DeviceKind]
    DEVICE_KIND_CUDA: _ClassVar[DeviceKind]
    DEVICE_KIND_ROCM: _ClassVar[DeviceKind]
    DEVICE_KIND_XPU: _ClassVar[DeviceKind]
    DEVICE_KIND_MPS: _ClassVar[DeviceKind]
    DEVICE_KIND_CPU: _ClassVar[DeviceKind]

class StepCacheMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_CACHE_MODE_UNSPECIFIED: _ClassVar[StepCacheMode]
    STEP_CACHE_MODE_OFF: _ClassVar[StepCacheMode]
    STEP_CACHE_MODE_FIRST_BLOCK: _ClassVar[StepCacheMode]
LOAD_PHASE_UNSPECIFIED: LoadPhase
LOAD_PHASE_VALIDATING: LoadPhase
LOAD_PHASE_WAITING_FOR_GPU: LoadPhase
LOAD_PHASE_DOWNLOADING: LoadPhase
LOAD_PHASE_BUILDING: LoadPhase
LOAD_PHASE_QUANTIZING: LoadPhase
LOAD_PHASE_COMPILING: LoadPhase
LOAD_PHASE_WARMING: LoadPhase
LOAD_PHASE_READY: LoadPhase
GENERATION_PHASE_UNSPECIFIED: GenerationPhase
GENERATION_PHASE_QUEUED: GenerationPhase
GENERATION_PHASE_ENCODING_PROMPT: GenerationPhase
GENERATION_PHASE_DENOISING: GenerationPhase
GENERATION_PHASE_DECODING: GenerationPhase
GENERATION_PHASE_ENCODING_IMAGES: GenerationPhase
GENERATION_PHASE_DONE: GenerationPhase
IMAGE_FORMAT_UNSPECIFIED: ImageFormat
IMAGE_FORMAT_PNG: ImageFormat
IMAGE_FORMAT_WEBP: ImageFormat
IMAGE_FORMAT_JPEG: ImageFormat
IMAGE_FORMAT_RAW_RGB8: ImageFormat
DEVICE_KIND_UNSPECIFIED: DeviceKind
DEVICE_KIND_CUDA: DeviceKind
DEVICE_KIND_ROCM: DeviceKind
DEVICE_KIND_XPU: DeviceKind
DEVICE_KIND_MPS: DeviceKind
DEVICE_KIND_CPU: DeviceKind
STEP_CACHE_MODE_UNSPECIFIED: StepCacheMode
STEP_CACHE_MODE_OFF: StepCacheMode
STEP_CACHE_MODE_FIRST_BLOCK: StepCacheMode

class LoadRequest(_message.Message):
    __slots__ = ("model_id", "family", "source", "compute_precision", "transformer_precision", "text_encoder_precision", "memory_mode", "speed_mode", "fp8_fast_accumulate", "priority", "device_index", "keep_alive", "max_pixels_per_call")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_PRECISION_FIELD_NUMBER: _ClassVar[int]
    TRANSFORMER_PRECISION_FIELD_NUMBER: _ClassVar[int]
    TEXT_ENCODER_PRECISION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MODE_FIELD_NUMBER: _ClassVar[int]
    SPEED_MODE_FIELD_NUMBER: _ClassVar[int]
    FP8_FAST_ACCUMULATE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_FIELD_NUMBER: _ClassVar[int]
    MAX_PIXELS_PER_CALL_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    family: _common_pb2.Family
    source: _common_pb2.ModelSource
    compute_precision: _common_pb2.Precision
    transformer_precision: _common_pb2.Precision
    text_encoder_precision: _common_pb2.Precision
    memory_mode: _common_pb2.MemoryMode
    speed_mode: _common_pb2.SpeedMode
    fp8_fast_accumulate: bool
    priority: int
    device_index: int
    keep_alive: _duration_pb2.Duration
    max_pixels_per_call: int
    def __init__(self, model_id: _Optional[str] = ..., family: _Optional[_Union[_common_pb2.Family, str]] = ..., source: _Optional[_Union[_common_pb2.ModelSource, _Mapping]] = ..., compute_precision: _Optional[_Union[_common_pb2.Precision, str]] = ..., transformer_precision: _Optional[_Union[_common_pb2.Precision, str]] = ..., text_encoder_precision: _Optional[_Union[_common_pb2.Precision, str]] = ..., memory_mode: _Optional[_Union[_common_pb2.MemoryMode, str]] = ..., speed_mode: _Optional[_Union[_common_pb2.SpeedMode, str]] = ..., fp8_fast_accumulate: _Optional[bool] = ..., priority: _Optional[int] = ..., device_index: _Optional[int] = ..., keep_alive: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_pixels_per_call: _Optional[int] = ...) -> None: ...

class LoadResponse(_message.Message):
    __slots__ = ("sequence", "phase", "message", "bytes_done", "bytes_total", "elapsed", "result")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    phase: LoadPhase
    message: str
    bytes_done: int
    bytes_total: int
    elapsed: _duration_pb2.Duration
    result: LoadedModel
    def __init__(self, sequence: _Optional[int] = ..., phase: _Optional[_Union[LoadPhase, str]] = ..., message: _Optional[str] = ..., bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ..., elapsed: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., result: _Optional[_Union[LoadedModel, _Mapping]] = ...) -> None: ...

class LoadedModel(_message.Message):
    __slots__ = ("model_id", "family", "device_name", "device_index", "estimated_footprint_bytes", "resolved", "loaded_time", "adapters", "limits", "owner")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_FOOTPRINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    LOADED_TIME_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    family: _common_pb2.Family
    device_name: str
    device_index: int
    estimated_footprint_bytes: int
    resolved: _containers.RepeatedCompositeFieldContainer[_common_pb2.ResolvedSetting]
    loaded_time: _timestamp_pb2.Timestamp
    adapters: _containers.RepeatedCompositeFieldContainer[AdapterRef]
    limits: ModelLimits
    owner: str
    def __init__(self, model_id: _Optional[str] = ..., family: _Optional[_Union[_common_pb2.Family, str]] = ..., device_name: _Optional[str] = ..., device_index: _Optional[int] = ..., estimated_footprint_bytes: _Optional[int] = ..., resolved: _Optional[_Iterable[_Union[_common_pb2.ResolvedSetting, _Mapping]]] = ..., loaded_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., adapters: _Optional[_Iterable[_Union[AdapterRef, _Mapping]]] = ..., limits: _Optional[_Union[ModelLimits, _Mapping]] = ..., owner: _Optional[str] = ...) -> None: ...

class ModelLimits(_message.Message):
    __slots__ = ("size_multiple", "max_width", "max_height", "max_prompt_tokens", "max_pixels_per_call")
    SIZE_MULTIPLE_FIELD_NUMBER: _ClassVar[int]
    MAX_WIDTH_FIELD_NUMBER: _ClassVar[int]
    MAX_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_PIXELS_PER_CALL_FIELD_NUMBER: _ClassVar[int]
    size_multiple: int
    max_width: int
    max_height: int
    max_prompt_tokens: int
    max_pixels_per_call: int
    def __init__(self, size_multiple: _Optional[int] = ..., max_width: _Optional[int] = ..., max_height: _Optional[int] = ..., max_prompt_tokens: _Optional[int] = ..., max_pixels_per_call: _Optional[int] = ...) -> None: ...

class AdapterRef(_message.Message):
    __slots__ = ("adapter_id", "weight")
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    weight: float
    def __init__(self, adapter_id: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model_id", "prompt", "negative_prompt", "width", "height", "steps", "guidance_scale", "seeds", "num_images", "adapters", "output_format", "encode_quality", "generation_id", "step_cache")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_SCALE_FIELD_NUMBER: _ClassVar[int]
    SEEDS_FIELD_NUMBER: _ClassVar[int]
    NUM_IMAGES_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    ENCODE_QUALITY_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_CACHE_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    prompt: str
    negative_prompt: str
    width: int
    height: int
    steps: int
    guidance_scale: float
    seeds: _containers.RepeatedScalarFieldContainer[int]
    num_images: int
    adapters: _containers.RepeatedCompositeFieldContainer[AdapterRef]
    output_format: ImageFormat
    encode_quality: int
    generation_id: str
    step_cache: StepCache
    def __init__(self, model_id: _Optional[str] = ..., prompt: _Optional[str] = ..., negative_prompt: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., steps: _Optional[int] = ..., guidance_scale: _Optional[float] = ..., seeds: _Optional[_Iterable[int]] = ..., num_images: _Optional[int] = ..., adapters: _Optional[_Iterable[_Union[AdapterRef, _Mapping]]] = ..., output_format: _Optional[_Union[ImageFormat, str]] = ..., encode_quality: _Optional[int] = ..., generation_id: _Optional[str] = ..., step_cache: _Optional[_Union[StepCache, _Mapping]] = ...) -> None: ...

class StepCache(_message.Message):
    __slots__ = ("mode", "threshold")
    MODE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    mode: StepCacheMode
    threshold: float
    def __init__(self, mode: _Optional[_Union[StepCacheMode, str]] = ..., threshold: _Optional[float] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("sequence", "generation_id", "phase", "queued", "progress", "result", "image")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    generation_id: str
    phase: GenerationPhase
    queued: GenerationQueued
    progress: StepProgress
    result: GenerateResult
    image: GeneratedImage
    def __init__(self, sequence: _Optional[int] = ..., generation_id: _Optional[str] = ..., phase: _Optional[_Union[GenerationPhase, str]] = ..., queued: _Optional[_Union[GenerationQueued, _Mapping]] = ..., progress: _Optional[_Union[StepProgress, _Mapping]] = ..., result: _Optional[_Union[GenerateResult, _Mapping]] = ..., image: _Optional[_Union[GeneratedImage, _Mapping]] = ...) -> None: ...

class GenerationQueued(_message.Message):
    __slots__ = ("position",)
    POSITION_FIELD_NUMBER: _ClassVar[int]
    position: int
    def __init__(self, position: _Optional[int] = ...) -> None: ...

class StepProgress(_message.Message):
    __slots__ = ("step", "total_steps", "elapsed", "eta", "attempt")
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_FIELD_NUMBER: _ClassVar[int]
    ETA_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    step: int
    total_steps: int
    elapsed: _duration_pb2.Duration
    eta: _duration_pb2.Duration
    attempt: int
    def __init__(self, step: _Optional[int] = ..., total_steps: _Optional[int] = ..., elapsed: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., eta: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., attempt: _Optional[int] = ...) -> None: ...

class GenerateResult(_message.Message):
    __slots__ = ("image_count", "timings", "resolved", "peak_memory_bytes")
    IMAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    image_count: int
    timings: GenerationTimings
    resolved: _containers.RepeatedCompositeFieldContainer[_common_pb2.ResolvedSetting]
    peak_memory_bytes: int
    def __init__(self, image_count: _Optional[int] = ..., timings: _Optional[_Union[GenerationTimings, _Mapping]] = ..., resolved: _Optional[_Iterable[_Union[_common_pb2.ResolvedSetting, _Mapping]]] = ..., peak_memory_bytes: _Optional[int] = ...) -> None: ...

class GeneratedImage(_message.Message):
    __slots__ = ("data", "mime_type", "seed", "width", "height")
    DATA_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    mime_type: str
    seed: int
    width: int
    height: int
    def __init__(self, data: _Optional[bytes] = ..., mime_type: _Optional[str] = ..., seed: _Optional[int] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class GenerationTimings(_message.Message):
    __slots__ = ("queued", "encode_prompt", "denoise", "decode", "encode_images", "total")
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    ENCODE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    DENOISE_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    ENCODE_IMAGES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    queued: _duration_pb2.Duration
    encode_prompt: _duration_pb2.Duration
    denoise: _duration_pb2.Duration
    decode: _duration_pb2.Duration
    encode_images: _duration_pb2.Duration
    total: _duration_pb2.Duration
    def __init__(self, queued: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., encode_prompt: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., denoise: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., decode: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., encode_images: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., total: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CancelGenerationRequest(_message.Message):
    __slots__ = ("generation_id",)
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    generation_id: str
    def __init__(self, generation_id: _Optional[str] = ...) -> None: ...

class CancelGenerationResponse(_message.Message):
    __slots__ = ("was_running",)
    WAS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    was_running: bool
    def __init__(self, was_running: _Optional[bool] = ...) -> None: ...

class UnloadRequest(_message.Message):
    __slots__ = ("model_id",)
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    def __init__(self, model_id: _Optional[str] = ...) -> None: ...

class UnloadResponse(_message.Message):
    __slots__ = ("freed_bytes",)
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    freed_bytes: int
    def __init__(self, freed_bytes: _Optional[int] = ...) -> None: ...

class GetInferenceStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetInferenceStatusResponse(_message.Message):
    __slots__ = ("models", "running_generation_id", "running_progress", "queue_depth", "max_queue_depth", "lease_id")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNING_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[LoadedModel]
    running_generation_id: str
    running_progress: StepProgress
    queue_depth: int
    max_queue_depth: int
    lease_id: str
    def __init__(self, models: _Optional[_Iterable[_Union[LoadedModel, _Mapping]]] = ..., running_generation_id: _Optional[str] = ..., running_progress: _Optional[_Union[StepProgress, _Mapping]] = ..., queue_depth: _Optional[int] = ..., max_queue_depth: _Optional[int] = ..., lease_id: _Optional[str] = ...) -> None: ...

class GetCapabilitiesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ComputeDevice(_message.Message):
    __slots__ = ("kind", "name", "compute_capability", "total_bytes", "free_bytes", "native_bf16")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    NATIVE_BF16_FIELD_NUMBER: _ClassVar[int]
    kind: DeviceKind
    name: str
    compute_capability: str
    total_bytes: int
    free_bytes: int
    native_bf16: bool
    def __init__(self, kind: _Optional[_Union[DeviceKind, str]] = ..., name: _Optional[str] = ..., compute_capability: _Optional[str] = ..., total_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., native_bf16: _Optional[bool] = ...) -> None: ...

class FamilyCapabilities(_message.Message):
    __slots__ = ("family", "compute_precisions", "transformer_precisions", "memory_modes", "speed_modes", "default_steps", "default_guidance_scale", "default_resolution", "dense_footprint_bytes", "notes")
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_PRECISIONS_FIELD_NUMBER: _ClassVar[int]
    TRANSFORMER_PRECISIONS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MODES_FIELD_NUMBER: _ClassVar[int]
    SPEED_MODES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_STEPS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_GUIDANCE_SCALE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    DENSE_FOOTPRINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    family: _common_pb2.Family
    compute_precisions: _containers.RepeatedScalarFieldContainer[_common_pb2.Precision]
    transformer_precisions: _containers.RepeatedScalarFieldContainer[_common_pb2.Precision]
    memory_modes: _containers.RepeatedScalarFieldContainer[_common_pb2.MemoryMode]
    speed_modes: _containers.RepeatedScalarFieldContainer[_common_pb2.SpeedMode]
    default_steps: int
    default_guidance_scale: float
    default_resolution: int
    dense_footprint_bytes: int
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, family: _Optional[_Union[_common_pb2.Family, str]] = ..., compute_precisions: _Optional[_Iterable[_Union[_common_pb2.Precision, str]]] = ..., transformer_precisions: _Optional[_Iterable[_Union[_common_pb2.Precision, str]]] = ..., memory_modes: _Optional[_Iterable[_Union[_common_pb2.MemoryMode, str]]] = ..., speed_modes: _Optional[_Iterable[_Union[_common_pb2.SpeedMode, str]]] = ..., default_steps: _Optional[int] = ..., default_guidance_scale: _Optional[float] = ..., default_resolution: _Optional[int] = ..., dense_footprint_bytes: _Optional[int] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class GetCapabilitiesResponse(_message.Message):
    __slots__ = ("devices", "families")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    FAMILIES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[ComputeDevice]
    families: _containers.RepeatedCompositeFieldContainer[FamilyCapabilities]
    def __init__(self, devices: _Optional[_Iterable[_Union[ComputeDevice, _Mapping]]] = ..., families: _Optional[_Iterable[_Union[FamilyCapabilities, _Mapping]]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[LoadedModel]
    def __init__(self, models: _Optional[_Iterable[_Union[LoadedModel, _Mapping]]] = ...) -> None: ...
