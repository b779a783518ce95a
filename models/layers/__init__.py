"""Graph layers of the split backbones, one per file."""

from models.layers.block import Block
from models.layers.feature_scale import FeatureScale
from models.layers.gat import GATLayer
from models.layers.gcn import GCNLayer
from models.layers.gcnii import GCNIILayer
from models.layers.sign import HopProjection, SignLayer

__all__ = [
    "Block",
    "FeatureScale",
    "GATLayer",
    "GCNIILayer",
    "GCNLayer",
    "HopProjection",
    "SignLayer",
]
