"""Replication of a stream's journal as state machines without I/O: they take ``now`` and what
arrived, and say what to send or write. The broker's adapter (:mod:`zeps.broker.replica`,
:mod:`zeps.broker.server`) and ZooKeeper's (:mod:`zeps.coordination.replication`) run them on real
sockets and sessions; the deterministic simulation (``tests/simulation``) runs the same machines on
a simulated clock, network, disk and ZooKeeper.

* :mod:`zeps.replication.isr` — the leader's in-sync set and commit point (Kafka's ISR and high
  watermark, KIP-497);
* :mod:`zeps.replication.follower` — a follower's copy (Kafka's fetch with leader epochs, KIP-101/279);
* :mod:`zeps.replication.election` — who leads in which epoch (the ZooKeeper leader election recipe,
  with the state written conditionally), as a recipe of ZooKeeper operations a driver runs.
"""
