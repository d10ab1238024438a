"""Detector heads: NonMaxSuppression (data-dependent output size) and RoiAlign."""
from __future__ import annotations

import numpy as np

from ir.errors import DataDependentShapeError
from ir.graph import TensorType
from ir.ops.registry import OPAQUE, register


# -- NonMaxSuppression ------------------------------------------------------------------------
def _corners(boxes, center_point_box):
    """[N, 4] boxes as (y1, x1, y2, x2) with y1 <= y2, x1 <= x2."""
    if center_point_box:
        xc, yc, w, h = boxes.T
        return np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=1)
    y1, x1, y2, x2 = boxes.T
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)], axis=1)


def _iou(box, others):
    y1, x1 = np.maximum(box[0], others[:, 0]), np.maximum(box[1], others[:, 1])
    y2, x2 = np.minimum(box[2], others[:, 2]), np.minimum(box[3], others[:, 3])
    inter = np.clip(y2 - y1, 0, None) * np.clip(x2 - x1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((inter > 0) & (union > 0) & (area > 0) & (areas > 0), inter / union, 0.0)


def _scalar(xs, i, default):
    return default if len(xs) <= i or xs[i] is None or np.size(xs[i]) == 0 else np.asarray(xs[i]).reshape(-1)[0]


def _nms(node, xs):
    boxes, scores = xs[0], xs[1]
    max_out = int(_scalar(xs, 2, 0))
    iou_thr = float(_scalar(xs, 3, 0.0))
    score_thr = _scalar(xs, 4, None)
    picked = []
    for b in range(boxes.shape[0]):
        corners = _corners(boxes[b].astype(np.float64), node.attrs.get("center_point_box", 0))
        for c in range(scores.shape[1]):
            s = scores[b, c]
            cand = np.arange(len(s)) if score_thr is None else np.nonzero(s > score_thr)[0]
            order = cand[np.argsort(-s[cand], kind="stable")]  # by score, ties by lower index
            keep: list[int] = []
            for i in order:
                if len(keep) >= max_out:
                    break
                if not keep or not np.any(_iou(corners[i], corners[keep]) > iou_thr):
                    keep.append(int(i))
            picked += [(b, c, i) for i in keep]
    return [np.asarray(picked, dtype=np.int64).reshape(-1, 3)]


def _nms_infer(node, types, consts):
    raise DataDependentShapeError(f"node '{node.name}' (NonMaxSuppression): how many boxes survive depends on the data")


register("NonMaxSuppression", OPAQUE, _nms_infer, _nms)


# -- RoiAlign -----------------------------------------------------------------------------------
def _roi_infer(node, types, consts):
    x, rois = types[0].shape, types[1].shape
    return [TensorType((rois[0], x[1], int(node.attrs.get("output_height", 1)), int(node.attrs.get("output_width", 1))),
                       types[0].dtype)]


def _bilinear_taps(coord, size):
    """Per sample coordinate: (low index, high index, weight of high), and which samples lie inside."""
    inside = (coord >= -1.0) & (coord <= size)
    c = np.clip(coord, 0, None)
    low = np.floor(c).astype(np.int64)
    at_end = low >= size - 1
    low = np.where(at_end, size - 1, low)
    high = np.where(at_end, size - 1, low + 1)
    frac = np.where(at_end, 0.0, c - low)
    return low, high, frac, inside


def _roi_align(node, xs):
    x, rois, batch = xs[0], xs[1].astype(np.float64), xs[2].astype(np.int64)
    oh, ow = int(node.attrs.get("output_height", 1)), int(node.attrs.get("output_width", 1))
    ratio, scale = int(node.attrs.get("sampling_ratio", 0)), float(node.attrs.get("spatial_scale", 1.0))
    half = node.attrs.get("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    is_max = node.attrs.get("mode", "avg") == "max"
    n, c, h, w = x.shape
    out = np.zeros((rois.shape[0], c, oh, ow), x.dtype)
    for r, (box, bi) in enumerate(zip(rois, batch)):
        x1, y1, x2, y2 = box * scale - (0.5 if half else 0.0)
        rw, rh = x2 - x1, y2 - y1
        if not half:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        gh = ratio if ratio > 0 else int(np.ceil(rh / oh))
        gw = ratio if ratio > 0 else int(np.ceil(rw / ow))
        ys = y1 + (np.arange(oh)[:, None] + (np.arange(gh)[None, :] + 0.5) / gh) * (rh / oh)   # [oh, gh]
        xs_ = x1 + (np.arange(ow)[:, None] + (np.arange(gw)[None, :] + 0.5) / gw) * (rw / ow)  # [ow, gw]
        yl, yh, fy, iny = _bilinear_taps(ys, h)
        xl, xh, fx, inx = _bilinear_taps(xs_, w)
        img = x[bi].astype(np.float64)                                    # [C, H, W]
        inside = (iny[:, :, None, None] & inx[None, None, :, :])          # [oh, gh, ow, gw]
        taps = []
        for yi, wy in ((yl, 1 - fy), (yh, fy)):
            for xi, wx in ((xl, 1 - fx), (xh, fx)):
                v = img[:, yi[:, :, None, None], xi[None, None, :, :]]   # [C, oh, gh, ow, gw]
                taps.append(v * (wy[:, :, None, None] * wx[None, None, :, :] * inside))
        if is_max:
            pooled = np.max(np.maximum.reduce(taps), axis=(2, 4))
        else:
            pooled = np.sum(taps, axis=0).sum(axis=(2, 4)) / max(gh * gw, 1)
        out[r] = pooled.astype(x.dtype)
    return [out]


register("RoiAlign", OPAQUE, _roi_infer, _roi_align)
