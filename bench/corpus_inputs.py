"""Real inputs for the corpus: photos, document pages, rendered text, faces and synthetic audio.

Photos come from scikit-learn's sample images and the photos in scikit-image's wheel (read from
the archive the corpus cache holds, not installed); text is rendered with PIL; faces are the
LFW crops scikit-image ships (`lfw_subset.npy`) and the astronaut's face; audio is synthesized
(voiced vowels with formants, noise bursts, silence). Every maker returns uint8 images (or float
audio) that `normalize` turns into one model's input layout and scale; sample i of the
calibration set never equals sample i of the evaluation set (`offset`).
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg", "motorcycle_left.png", "hubble_deep_field.jpg",
          "retina.jpg", "color.png", "brick.png", "grass.png", "gravel.png", "logo.png")
PAGES = ("page.png", "text.png", "camera.png", "coins.png")
WORDS = ("qcc compiles", "quantization", "HELLO WORLD", "int8 kernels", "2024-06-01", "Total: 42.50",
         "ONNX Runtime", "fixed point", "memory plan", "nnabla", "edge devices", "calibration",
         "per channel", "lookup table", "Sony 1.39", "zero point", "scale 0.125", "receipt #1093")


def _skimage_file(wheel: Path, name: str) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(f"skimage/data/{name}")


def _image(data: bytes) -> np.ndarray:
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    return np.asarray(img.convert("RGB"))


def _resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(img).resize((w, h), Image.Resampling.BILINEAR))


def photos(skimage_wheel: Path) -> list[np.ndarray]:
    from sklearn.datasets import load_sample_images

    images = list(load_sample_images().images)
    images += [_image(_skimage_file(skimage_wheel, name)) for name in PHOTOS]
    return images


def _font(size: int) -> Any:
    from PIL import ImageFont

    for path in ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "DejaVuSans.ttf"):
        try:
            return ImageFont.truetype(path, size)
        except OSError:
            continue
    return ImageFont.load_default(size=size)


def text_line(text: str, h: int, w: int, seed: int) -> np.ndarray:
    """One line of dark text on a light, slightly noisy background (what a recognizer reads)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    bg = int(rng.integers(200, 256))
    img = Image.new("RGB", (w, h), (bg, bg, bg))
    draw = ImageDraw.Draw(img)
    size = int(h * rng.uniform(0.55, 0.75))
    ink = tuple(int(v) for v in rng.integers(0, 80, 3))
    draw.text((int(rng.integers(2, 10)), (h - size) // 2 - 2), text, fill=ink, font=_font(size))
    arr = np.asarray(img).astype(np.int16) + rng.integers(-8, 9, (h, w, 3))
    out = np.clip(arr, 0, 255).astype(np.uint8)
    return out[::-1, ::-1].copy() if seed % 4 == 3 else out  # some lines upside down (orientation)


def page(skimage_wheel: Path, h: int, w: int, seed: int) -> np.ndarray:
    """A photo or scanned page with lines of text pasted on it (detectors find the text)."""
    rng = np.random.default_rng(seed)
    sources = [_image(_skimage_file(skimage_wheel, n)) for n in PAGES]
    base = _resize(sources[seed % len(sources)], h, w).copy()
    for k in range(int(rng.integers(2, 5))):
        lh = int(rng.integers(18, 34))
        lw = int(min(w - 8, rng.integers(100, 240)))
        line = text_line(WORDS[(seed + k) % len(WORDS)], lh, lw, seed * 7 + k * 4)
        y, x = int(rng.integers(0, h - lh)), int(rng.integers(0, w - lw))
        base[y:y + lh, x:x + lw] = line
    return base


def faces(skimage_wheel: Path, h: int, w: int) -> list[np.ndarray]:
    """LFW face crops (grayscale, as RGB), the astronaut's face, and non-face patches."""
    lfw = np.load(io.BytesIO(_skimage_file(skimage_wheel, "lfw_subset.npy")))
    out = [_resize(np.repeat((np.clip(f, 0, 1) * 255).astype(np.uint8)[..., None], 3, axis=2), h, w)
           for f in lfw[::6]]
    astro = _image(_skimage_file(skimage_wheel, "astronaut.png"))
    out.insert(0, _resize(astro[30:210, 140:300], h, w))
    for img in photos(skimage_wheel)[2:]:  # patches without faces: the classifier's other class
        out.append(_resize(img[: img.shape[0] // 2, : img.shape[1] // 2], h, w))
    return out


def audio(n_frames: int, frame: int, seed: int, rate: int = 16000) -> np.ndarray:
    """Speech-like audio: voiced vowels (a pitch with formant harmonics), noise bursts, silence."""
    rng = np.random.default_rng(seed)
    total = n_frames * frame
    t = np.arange(total) / rate
    signal = rng.normal(0, 0.003, total)
    pos = 0
    while pos < total:
        length = int(rng.integers(rate // 8, rate // 3))
        kind = rng.integers(0, 3)
        seg = slice(pos, min(total, pos + length))
        if kind == 0:  # a vowel: f0 with harmonics shaped by two formants
            f0 = rng.uniform(90, 220)
            formants = rng.uniform(300, 900), rng.uniform(900, 2500)
            voiced = sum(np.sin(2 * np.pi * k * f0 * t[seg]) * sum(np.exp(-((k * f0 - f) / 150) ** 2) for f in formants)
                         for k in range(1, int(3500 // f0)))
            signal[seg] += 0.3 * voiced * np.hanning(len(t[seg]))
        elif kind == 1:
            signal[seg] += rng.normal(0, 0.05, len(t[seg]))
        pos += length + int(rng.integers(0, rate // 6))
    return signal.astype(np.float32).reshape(n_frames, frame)


def normalize(images: list[np.ndarray], shape: tuple[int, ...], layout: str, mean: tuple[float, ...],
              std: tuple[float, ...], scale255: bool) -> np.ndarray:
    """uint8 HWC images -> float32 samples of one model input shape (batch dim 1 dropped)."""
    if layout == "NHWC":
        h, w, c = shape[1], shape[2], shape[3]
    else:
        c, h, w = shape[1], shape[2], shape[3]
    out = []
    for img in images:
        x = _resize(img, h, w).astype(np.float32)
        if c == 1:
            x = x.mean(axis=2, keepdims=True)
        x = x if scale255 else x / 255.0
        x = (x - np.asarray(mean[:c], np.float32)) / np.asarray(std[:c], np.float32)
        out.append(x if layout == "NHWC" else x.transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)
