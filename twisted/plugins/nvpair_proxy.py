"""twistd plugin: ``twistd -n nvpair-proxy``. Imports nothing but ServiceMaker."""

from twisted.application.service import ServiceMaker

nvpairProxy = ServiceMaker(
    "nvpair proxy",
    "nvpair.tap",
    "Inference router: one engine-dialect facade per engine, failover, broker on stdio.",
    "nvpair-proxy",
)
