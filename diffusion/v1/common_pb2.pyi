from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Precision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRECISION_UNSPECIFIED: _ClassVar[Precision]
    PRECISION_AUTO: _ClassVar[Precision]
    PRECISION_BF16: _ClassVar[Precision]
    PRECISION_FP16: _ClassVar[Precision]
    PRECISION_FP32: _ClassVar[Precision]
    PRECISION_NF4: _ClassVar[Precision]
    PRECISION_INT8: _ClassVar[Precision]
    PRECISION_FP8: _ClassVar[Precision]
    PRECISION_MXFP8: _ClassVar[Precision]
    PRECISION_NVFP4: _ClassVar[Precision]

class MemoryMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMORY_MODE_UNSPECIFIED: _ClassVar[MemoryMode]
    MEMORY_MODE_AUTO: _ClassVar[MemoryMode]
    MEMORY_MODE_RESIDENT: _ClassVar[MemoryMode]
    MEMORY_MODE_BALANCED: _ClassVar[MemoryMode]
    MEMORY_MODE_LOW_VRAM: _ClassVar[MemoryMode]
    MEMORY_MODE_SEQUENTIAL: _ClassVar[MemoryMode]

class SpeedMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPEED_MODE_UNSPECIFIED: _ClassVar[SpeedMode]
    SPEED_MODE_OFF: _ClassVar[SpeedMode]
    SPEED_MODE_DEFAULT: _ClassVar[SpeedMode]
    SPEED_MODE_MAX: _ClassVar[SpeedMode]

class Family(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAMILY_UNSPECIFIED: _ClassVar[Family]
    FAMILY_FLUX1: _ClassVar[Family]
    FAMILY_ZIMAGE: _ClassVar[Family]
    FAMILY_QWEN_IMAGE: _ClassVar[Family]
    FAMILY_SDXL: _ClassVar[Family]

class SettingSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SETTING_SOURCE_UNSPECIFIED: _ClassVar[SettingSource]
    SETTING_SOURCE_AUTO: _ClassVar[SettingSource]
    SETTING_SOURCE_EXPLICIT: _ClassVar[SettingSource]
    SETTING_SOURCE_DEFAULT: _ClassVar[SettingSource]

class SettingStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SETTING_STATUS_UNSPECIFIED: _ClassVar[SettingStatus]
    SETTING_STATUS_APPLIED: _ClassVar[SettingStatus]
    SETTING_STATUS_FELL_BACK: _ClassVar[SettingStatus]
    SETTING_STATUS_UNSUPPORTED: _ClassVar[SettingStatus]
PRECISION_UNSPECIFIED: Precision
PRECISION_AUTO: Precision
PRECISION_BF16: Precision
PRECISION_FP16: Precision
PRECISION_FP32: Precision
PRECISION_NF4: Precision
PRECISION_INT8: Precision
PRECISION_FP8: Precision
PRECISION_MXFP8: Precision
PRECISION_NVFP4: Precision
MEMORY_MODE_UNSPECIFIED: MemoryMode
MEMORY_MODE_AUTO: MemoryMode
MEMORY_MODE_RESIDENT: MemoryMode
MEMORY_MODE_BALANCED: MemoryMode
MEMORY_MODE_LOW_VRAM: MemoryMode
MEMORY_MODE_SEQUENTIAL: MemoryMode
SPEED_MODE_UNSPECIFIED: SpeedMode
SPEED_MODE_OFF: SpeedMode
SPEED_MODE_DEFAULT: SpeedMode
SPEED_MODE_MAX: SpeedMode
FAMILY_UNSPECIFIED: Family
FAMILY_FLUX1: Family
FAMILY_ZIMAGE: Family
FAMILY_QWEN_IMAGE: Family
FAMILY_SDXL: Family
SETTING_SOURCE_UNSPECIFIED: SettingSource
SETTING_SOURCE_AUTO: SettingSource
SETTING_SOURCE_EXPLICIT: SettingSource
SETTING_SOURCE_DEFAULT: SettingSource
SETTING_STATUS_UNSPECIFIED: SettingStatus
SETTING_STATUS_APPLIED: SettingStatus
SETTING_STATUS_FELL_BACK: SettingStatus
SETTING_STATUS_UNSUPPORTED: SettingStatus

class ResolvedSetting(_message.Message):
    __slots__ = ("control", "requested", "applied", "source", "status", "reason")
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    control: str
    requested: str
    applied: str
    source: SettingSource
    status: SettingStatus
    reason: str
    def __init__(self, control: _Optional[str] = ..., requested: _Optional[str] = ..., applied: _Optional[str] = ..., source: _Optional[_Union[SettingSource, str]] = ..., status: _Optional[_Union[SettingStatus, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ModelSource(_message.Message):
    __slots__ = ("local_dir", "hub_repo", "single_file", "gguf")
    LOCAL_DIR_FIELD_NUMBER: _ClassVar[int]
    HUB_REPO_FIELD_NUMBER: _ClassVar[int]
    SINGLE_FILE_FIELD_NUMBER: _ClassVar[int]
    GGUF_FIELD_NUMBER: _ClassVar[int]
    local_dir: str
    hub_repo: HubRepo
    single_file: SingleFileCheckpoint
    gguf: GgufTransformer
    def __init__(self, local_dir: _Optional[str] = ..., hub_repo: _Optional[_Union[HubRepo, _Mapping]] = ..., single_file: _Optional[_Union[SingleFileCheckpoint, _Mapping]] = ..., gguf: _Optional[_Union[GgufTransformer, _Mapping]] = ...) -> None: ...

class HubRepo(_message.Message):
    __slots__ = ("repo_id", "revision", "variant")
    REPO_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    repo_id: str
    revision: str
    variant: str
    def __init__(self, repo_id: _Optional[str] = ..., revision: _Optional[str] = ..., variant: _Optional[str] = ...) -> None: ...

class SingleFileCheckpoint(_message.Message):
    __slots__ = ("path", "companions")
    PATH_FIELD_NUMBER: _ClassVar[int]
    COMPANIONS_FIELD_NUMBER: _ClassVar[int]
    path: str
    companions: ModelSource
    def __init__(self, path: _Optional[str] = ..., companions: _Optional[_Union[ModelSource, _Mapping]] = ...) -> None: ...

class GgufTransformer(_message.Message):
    __slots__ = ("path", "base")
    PATH_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    path: str
    base: ModelSource
    def __init__(self, path: _Optional[str] = ..., base: _Optional[_Union[ModelSource, _Mapping]] = ...) -> None: ...
