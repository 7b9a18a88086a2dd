"""An H.264 MP4 made from photos, as a phone or x264 writes one (High profile, B-frames): the
video source of the predict benchmark (`cpu_predict.sh`, docs/bench.md).

usage: python make_clip.py IMAGES_DIR OUT.mp4 [--frames 100] [--fps 25] [--size 640x360]

Each photo is shown for 10 frames while the view pans across it. Needs PyAV (`pip install av`,
whose wheels carry FFmpeg with libx264).
"""

import argparse
import os

import av
import numpy as np
from PIL import Image


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("images")
    ap.add_argument("out")
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--fps", type=int, default=25)
    ap.add_argument("--size", default="640x360")
    a = ap.parse_args()
    w, h = (int(v) for v in a.size.split("x"))
    photos = sorted(
        os.path.join(a.images, f)
        for f in os.listdir(a.images)
        if f.lower().endswith((".jpg", ".jpeg", ".png"))
    )
    out = av.open(a.out, "w")
    stream = out.add_stream("libx264", rate=a.fps)
    stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
    stream.options = {"profile": "high", "bframes": "3", "crf": "20"}
    for i in range(a.frames):
        photo = np.asarray(Image.open(photos[(i // 10) % len(photos)]).convert("RGB").resize(
            (w + w // 4, h + h // 4)))
        t = i % 10
        x, y = t * (w // 4) // 10, t * (h // 4) // 10
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(photo[y:y + h, x:x + w]),
                                           format="rgb24")
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)
    out.close()


if __name__ == "__main__":
    main()
