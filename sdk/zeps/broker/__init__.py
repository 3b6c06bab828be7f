"""The embeddable ZEPS broker: :class:`BrokerCore` (logic, no sockets) and :class:`BrokerServer`
(the ZeroMQ ROUTER around it); ``zeps-broker`` runs one."""

from zeps.broker.core import BrokerConfig, BrokerCore
from zeps.broker.server import BrokerServer, CurveConfig, Registration

__all__ = ["BrokerConfig", "BrokerCore", "BrokerServer", "CurveConfig", "Registration"]
