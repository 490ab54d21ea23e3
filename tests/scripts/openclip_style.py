"""A trimmed copy of OpenCLIP's webdataset input pipeline (open_clip_train/data.py, which pins
webdataset 0.2.86), importing `webdataset` exactly as it does. Run it through
`python -m shardstream.run`; it prints one JSON line per batch.
"""

import json
import random
import sys

import webdataset as wds
from webdataset.filters import _shuffle
from webdataset.shardlists import expand_urls
from webdataset.tariterators import (
    base_plus_ext,
    tar_file_expander,
    url_opener,
    valid_sample,
)


def log_and_continue(exn):
    print(f"Handling webdataset error ({repr(exn)}). Ignoring.", file=sys.stderr)
    return True


def group_by_keys_nothrow(data, keys=base_plus_ext, lcase=True, suffixes=None, handler=None):
    current_sample = None
    for filesample in data:
        assert isinstance(filesample, dict)
        fname, value = filesample["fname"], filesample["data"]
        prefix, suffix = keys(fname)
        if prefix is None:
            continue
        if lcase:
            suffix = suffix.lower()
        if current_sample is None or prefix != current_sample["__key__"] or suffix in current_sample:
            if valid_sample(current_sample):
                yield current_sample
            current_sample = dict(__key__=prefix, __url__=filesample["__url__"])
        if suffixes is None or suffix in suffixes:
            current_sample[suffix] = value
    if valid_sample(current_sample):
        yield current_sample


def tarfile_to_samples_nothrow(src, handler=log_and_continue):
    streams = url_opener(src, handler=handler)
    files = tar_file_expander(streams, handler=handler)
    samples = group_by_keys_nothrow(files, handler=handler)
    return samples


class detshuffle2(wds.PipelineStage):
    def __init__(self, bufsize=1000, initial=100, seed=0, epoch=-1):
        self.bufsize = bufsize
        self.initial = initial
        self.seed = seed
        self.epoch = epoch

    def run(self, src):
        self.epoch += 1
        rng = random.Random()
        rng.seed(self.seed + self.epoch)
        return _shuffle(src, self.bufsize, self.initial, rng)


def filter_no_caption_or_no_image(sample):
    return ("txt" in sample) and ("png" in sample or "jpg" in sample or "jpeg" in sample)


def main():
    urls = expand_urls(sys.argv[1:])  # a list, as OpenCLIP passes after its own :: handling
    pipeline = [
        wds.SimpleShardList(urls),
        detshuffle2(bufsize=4, initial=2, seed=7, epoch=0),
        wds.split_by_node,
        wds.split_by_worker,
        tarfile_to_samples_nothrow,
        wds.shuffle(bufsize=8, initial=4, rng=random.Random(3)),
        wds.select(filter_no_caption_or_no_image),
        wds.decode("pilrgb", handler=log_and_continue),
        wds.rename(image="jpg;png;jpeg;webp", text="txt"),
        wds.map_dict(image=lambda im: list(im.resize((4, 4)).getdata()), text=lambda t: t.upper()),
        wds.to_tuple("image", "text"),
        wds.batched(3, partial=True),
    ]
    dataset = wds.DataPipeline(*pipeline)
    for images, texts in dataset:
        print(json.dumps({"images": images, "texts": texts}))


if __name__ == "__main__":
    main()
