"""qcc's own passes, frontends and backends, registered exactly like a plugin's."""

from __future__ import annotations

from qcc.plugin_api import API_VERSION, Plugin

BUILTINS = Plugin(
    api_version=API_VERSION,
    passes={
        "dce": "qcc.passes.cleanup:DeadCodeElimination",
        "fold-constants": "qcc.passes.cleanup:FoldConstants",
        "fold-bn": "qcc.passes.fold_bn:FoldBatchNorm",
        "equalize": "qcc.passes.equalize:Equalize",
        "insert-quantize": "qcc.passes.insert_quantize:InsertQuantize",
        "calibrate": "qcc.passes.calibrate:Calibrate",
        "apply-overrides": "qcc.passes.apply_overrides:ApplyOverrides",
        "exclude-nodes": "qcc.passes.exclude_nodes:ExcludeNodes",
        "quantize-affine": "qcc.passes.quantize_affine:QuantizeAffine",
        "assign-fixed-point": "qcc.passes.assign_fixed_point:AssignFixedPoint",
        "binarize-weights": "qcc.passes.binarize_weights:BinarizeWeights",
        "bias-correct": "qcc.passes.bias_correct:BiasCorrect",
        "check-fixed-point": "qcc.passes.check_fixed_point:CheckFixedPoint",
        "learned-rounding": "qcc.passes.learned_rounding:LearnedRounding",
        "sensitivity": "qcc.passes.sensitivity:Sensitivity",
        "accuracy-control": "qcc.passes.accuracy_control:AccuracyControl",
        "plan-memory": "qcc.passes.plan_memory:PlanMemory",
        "reorder": "qcc.passes.reorder:Reorder",
        "legalize-nnb": "qcc.backends.nnb.legalize:LegalizeNnb",
        "fuse-layernorm": "qcc.passes.fuse_layernorm:FuseLayerNorm",
    },
    frontends={
        "onnx": "qcc.frontends.onnx:FRONTEND",
        "nnp": "qcc.frontends.nnp:FRONTEND",
        "torch": "qcc.frontends.torch:FRONTEND",
    },
    backends={
        "onnx": "qcc.backends.onnx_float:BACKEND",
        "c": "qcc.backends.c:BACKEND",
        "nnb": "qcc.backends.nnb.backend:BACKEND",
        "onnx-qdq": "qcc.backends.onnx_qdq:BACKEND",
        "nnp": "qcc.backends.nnp:BACKEND",
    },
)
