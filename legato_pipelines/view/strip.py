"""A strip of thumbnails for Dagster metadata: the best and the worst rollout of a batch, each
as its first and last screenshot with a caption (one small JPEG, Pillow)."""

from __future__ import annotations

import io
from pathlib import Path

from ..record import Record

STRIP_THUMB = 240
"""Width [px] of each screenshot in the strip."""


def _caption(label: str, r: Record) -> str:
    reward = "n/a" if r.reward is None else f"{r.reward:.2f}"
    return f"{label}: {r.task_id} attempt {r.attempt} · reward {reward} · {r.n_steps} steps"


def rollout_strip(
    run_dir: str | Path, rows: list[tuple[str, Record]], width: int = STRIP_THUMB
) -> bytes | None:
    """One JPEG: a row per ``(label, record)`` (e.g. ``("best", r)``), each the record's first
    and last screenshot ``width`` px wide under a caption. ``None`` when no screenshot could be
    read."""
    from PIL import Image, ImageDraw, ImageFont, UnidentifiedImageError

    images = Path(run_dir) / "images"
    font = ImageFont.load_default(size=14)
    pad, caption_h = 8, 22
    rendered = []
    for label, r in rows:
        shots = [s.observation for s in r.steps if s.observation]
        picks = [shots[0], shots[-1]] if len(shots) > 1 else shots
        thumbs = []
        for sha in picks:
            try:
                with Image.open(images / f"{sha}.png") as im:
                    im.load()
                    factor = max(1, im.width // (width * 2))
                    small = im.reduce(factor) if factor > 1 else im
                    height = max(1, round(small.height * width / small.width))
                    thumbs.append(small.convert("RGB").resize((width, height)))
            except (OSError, UnidentifiedImageError, ValueError):
                continue
        if thumbs:
            rendered.append((_caption(label, r), thumbs))
    if not rendered:
        return None
    row_h = max(t.height for _, thumbs in rendered for t in thumbs)
    canvas = Image.new(
        "RGB",
        (pad + 2 * (width + pad), pad + len(rendered) * (caption_h + row_h + pad)),
        "white",
    )
    draw = ImageDraw.Draw(canvas)
    y = pad
    for caption, thumbs in rendered:
        draw.text((pad, y + 3), caption, fill="black", font=font)
        y += caption_h
        for i, thumb in enumerate(thumbs):
            x = pad + i * (width + pad)
            canvas.paste(thumb, (x, y))
            draw.rectangle((x - 1, y - 1, x + thumb.width, y + thumb.height), outline="#888888")
            draw.text(
                (x + 4, y + thumb.height - 18),
                "first" if i == 0 else "last",
                fill="yellow",
                font=font,
                stroke_width=2,
                stroke_fill="black",
            )
        y += row_h + pad
    buffer = io.BytesIO()
    canvas.save(buffer, format="JPEG", quality=72, optimize=True)
    return buffer.getvalue()
