"""Catalogs: hardware (:mod:`hetpart.catalog.hardware`), models (:mod:`hetpart.catalog.models`) and
bundled clusters (``catalog/clusters/*.yaml``), each entry with the source of its figures."""

from hetpart.catalog.hardware import GPU_CATALOG, LINK_CATALOG, NIC_CATALOG

__all__ = ["GPU_CATALOG", "LINK_CATALOG", "NIC_CATALOG"]
