"""STL-10 from its binary release (``root/stl10_binary/*.bin``), read by torchvision."""

from __future__ import annotations

import os

from torchvision import datasets

IMAGE_BYTES = 3 * 96 * 96


class STL10(datasets.STL10):
    """torchvision's STL-10 with a cheap integrity check.

    torchvision hashes every binary file (2.6 GB) each time a split is constructed; here the
    check is that each file exists and holds whole images (labels: one byte each), which is what
    catches a missing or truncated download. ``download=True`` still verifies the archive's MD5.
    """

    def _check_integrity(self) -> bool:
        folder = os.path.join(self.root, self.base_folder)
        for filename, _ in self.train_list + self.test_list:
            path = os.path.join(folder, filename)
            if not os.path.isfile(path):
                return False
            if filename.endswith("_X.bin") and os.path.getsize(path) % IMAGE_BYTES != 0:
                return False
        for split in ("train", "test"):
            num_images = os.path.getsize(os.path.join(folder, f"{split}_X.bin")) // IMAGE_BYTES
            if os.path.getsize(os.path.join(folder, f"{split}_y.bin")) != num_images:
                return False
        return True
