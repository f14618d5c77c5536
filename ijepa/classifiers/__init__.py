"""Classifiers on frozen features: the one home of what the in-fit probes (``ijepa.callbacks``)
and the ``ijepa eval`` protocols (``ijepa.evaluation``) fit and score.

- :mod:`~ijepa.classifiers.features`: sharded extraction of a labelled split's features;
- :mod:`~ijepa.classifiers.knn`: the cosine-weighted k-NN vote, one k or a sweep;
- :mod:`~ijepa.classifiers.logistic`: L-BFGS logistic regression (scikit-learn's objective);
- :mod:`~ijepa.classifiers.heads`: grids of linear and attentive heads trained together;
- :mod:`~ijepa.classifiers.segmentation`: grids of linear segmentation heads on patch tokens, mIoU;
- :mod:`~ijepa.classifiers.metrics`: top-1 accuracy.

The labelled collate and the evaluation transform are data: :func:`ijepa.data.collate.labeled_collate`
and :func:`ijepa.data.transforms.eval_transform`, shared by both callers.
"""

from ijepa.classifiers.features import Features, extract_features, gather_in_order, shard_indices
from ijepa.classifiers.heads import (
    AttentiveHead,
    AttentiveHeadGrid,
    HeadGridTrainer,
    LinearHeadGrid,
    cosine_lr_scheduler,
    feature_batches,
    grid_accuracy,
    grid_loss,
    grid_optimizer,
    grid_scores,
    product_grid,
)
from ijepa.classifiers.knn import knn_scores, knn_sweep
from ijepa.classifiers.logistic import default_Cs, fit_logistic, l2_of_C, logreg_fit, logreg_sweep
from ijepa.classifiers.metrics import top1
from ijepa.classifiers.segmentation import (
    SegmentationHeadGrid,
    confusion_matrices,
    grid_confusions,
    segmentation_grid_loss,
    segmentation_scores,
    token_grid_ceiling,
    token_majority,
    upsample_logits,
)

__all__ = [
    "AttentiveHead",
    "AttentiveHeadGrid",
    "Features",
    "HeadGridTrainer",
    "LinearHeadGrid",
    "SegmentationHeadGrid",
    "confusion_matrices",
    "cosine_lr_scheduler",
    "default_Cs",
    "extract_features",
    "feature_batches",
    "fit_logistic",
    "gather_in_order",
    "grid_accuracy",
    "grid_confusions",
    "grid_loss",
    "grid_optimizer",
    "grid_scores",
    "knn_scores",
    "knn_sweep",
    "l2_of_C",
    "logreg_fit",
    "logreg_sweep",
    "product_grid",
    "segmentation_grid_loss",
    "segmentation_scores",
    "shard_indices",
    "token_grid_ceiling",
    "token_majority",
    "top1",
    "upsample_logits",
]
