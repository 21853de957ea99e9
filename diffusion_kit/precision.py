"""Every numeric precision this project knows, in one table: the one place to change a precision.

`Precision` is the form a precision takes from the servicer edge to the trainer's config: a string
enum ("bf16", "fp8", ...), so it reads back from JSON as itself. The wire enum (`common.proto`'s
Precision) is converted at the edge and in records; every other map (dense dtypes, quantisation
schemes, footprint bits, training bytes per parameter, what training compiles) is derived from
`TABLE` below. No torch here: dtypes are named, and the torch side looks them up.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from diffusion.v1 import common_pb2 as c


class Precision(str, Enum):
    UNSPECIFIED = "unspecified"
    AUTO = "auto"
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    NF4 = "nf4"
    INT8 = "int8"
    FP8 = "fp8"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"

    def __str__(self) -> str:
        return self.value

    @property
    def facts(self) -> "PrecisionFacts":
        return TABLE[self]

    @property
    def proto(self) -> int:
        return TABLE[self].proto

    @property
    def proto_name(self) -> str:
        """The wire name ("PRECISION_BF16"), which resolved records and messages quote."""
        return c.Precision.Name(TABLE[self].proto)

    @classmethod
    def of_proto(cls, value: int) -> "Precision":
        """The wire value as a Precision; ValueError for a number the enum does not define."""
        try:
            return _BY_PROTO[value]
        except KeyError:
            raise ValueError(f"{value} is not a Precision") from None


@dataclass(frozen=True)
class PrecisionFacts:
    proto: int
    dense: bool  # a compute dtype (the weights are plain tensors of it)
    torch_dtype: str | None  # the torch dtype the weights are held in (quantised: their compute dtype)
    inference_bits: float | None  # bits per weight a loaded denoiser keeps, scales and skipped layers included
    training_bytes: float | None  # frozen-base bytes per parameter during a LoRA step (None: not a training base)
    training_compiles: bool  # regional compile handles a base held this way
    loads_as_bf16: bool  # a training base loaded in bf16 onto the GPU and quantised there
    library: str | None  # who quantises: "torchao", "bitsandbytes"; None for dense
    needs: str  # "" | "fp8" (compute capability 8.9+) | "blackwell" (10.0+)


# bits per weight: fp8/int8 keep a scale per row and skip the small layers (8.5); nvfp4 4.5; bitsandbytes nf4
# keeps more of the model dense (5.5: an nf4 Z-Image used 16.8 GiB under a lease sized at 4.5 bits, 16.5).
# Training bytes per parameter are fitted so weights + activations cover the measured step peaks of
# FLUX and Z-Image on an H200 (docs/bench/training.md); fp8 keeps the bf16 weight plus an fp8 copy
# saved for the backward pass, hence above bf16.
TABLE: dict[Precision, PrecisionFacts] = {
    Precision.UNSPECIFIED: PrecisionFacts(c.PRECISION_UNSPECIFIED, False, None, None, None, False, False, None, ""),
    Precision.AUTO: PrecisionFacts(c.PRECISION_AUTO, False, None, None, None, False, False, None, ""),
    Precision.BF16: PrecisionFacts(c.PRECISION_BF16, True, "bfloat16", 16, 2.0, True, False, None, ""),
    Precision.FP16: PrecisionFacts(c.PRECISION_FP16, True, "float16", 16, 2.0, True, False, None, ""),
    Precision.FP32: PrecisionFacts(c.PRECISION_FP32, True, "float32", 32, 4.0, True, False, None, ""),
    Precision.NF4: PrecisionFacts(c.PRECISION_NF4, False, "bfloat16", 5.5, 0.85, True, False, "bitsandbytes", ""),
    Precision.INT8: PrecisionFacts(c.PRECISION_INT8, False, "bfloat16", 8.5, 1.15, False, True, "torchao", ""),
    Precision.FP8: PrecisionFacts(c.PRECISION_FP8, False, "bfloat16", 8.5, 2.5, True, True, "torchao", "fp8"),
    Precision.MXFP8: PrecisionFacts(c.PRECISION_MXFP8, False, "bfloat16", 8.5, 2.5, True, True, "torchao",
                                    "blackwell"),
    Precision.NVFP4: PrecisionFacts(c.PRECISION_NVFP4, False, "bfloat16", 4.5, None, False, False, "torchao",
                                    "blackwell"),
}
_BY_PROTO = {facts.proto: p for p, facts in TABLE.items()}

# Derived views, for the policies that ask one question of the table.
DENSE = tuple(p for p, f in TABLE.items() if f.dense)  # what compute_precision takes
QUANTIZED = tuple(p for p, f in TABLE.items() if f.library)  # what transformer_precision takes
TORCHAO_SCHEMES = tuple(p for p, f in TABLE.items() if f.library == "torchao")  # the smoke probe tries these
BLACKWELL_ONLY = frozenset(p for p, f in TABLE.items() if f.needs == "blackwell")
TRAINING_BASES = tuple(p for p, f in TABLE.items() if f.training_bytes is not None)
# Bases whose compiled training graphs save to disk but do not load back in a later job (torch.compiler
# load_compiled_function over bitsandbytes 4-bit blocks failed on an H100): they take the regular compile.
GRAPHS_DO_NOT_RELOAD = frozenset({Precision.NF4})


def names(precisions) -> str:
    """"NF4, BF16 or INT8": how a message lists the values a field takes."""
    short = [p.proto_name.removeprefix("PRECISION_") for p in precisions]
    return ", ".join(short[:-1]) + f" or {short[-1]}" if len(short) > 1 else "".join(short)
