"""Path layout and option validation: bad input names the field and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zeps.errors import ConfigError
from zeps.options import TopicOptions
from zeps.paths import QueuePaths, StreamPaths, TopicPaths, chroot_of, paths_of, sequence_of


def test_topic_layout() -> None:
    paths = TopicPaths.of("shop", "cache-invalidation")
    assert paths.root == "/zeps/shop/topics/cache-invalidation"
    assert paths.clients.members == "/zeps/shop/topics/cache-invalidation/clients"
    assert paths.subscribers.member("pod-1") == "/zeps/shop/topics/cache-invalidation/subscribers/pod-1"
    assert paths.queue("pod-1") == "/zeps/shop/topics/cache-invalidation/messages/pod-1"
    assert TopicPaths.of("a", "b", chroot="/x/y").root == "/x/y/a/topics/b"


def test_the_sdk_ensures_what_the_layout_names() -> None:
    """What the SDK classes create (their mode's nodes) is read from the same layout the operator
    creates: the modes split the Queue's layout, and a Topic's delivery nodes are all but parked/."""
    queue = QueuePaths.of("shop", "crawl")
    assert set(queue.work_layout()).isdisjoint(queue.batch_layout())
    assert queue.work_layout() + queue.batch_layout() == queue.layout()
    assert queue.batch_writers in queue.batch_layout()
    topic = TopicPaths.of("shop", "cache")
    assert set(topic.layout()) - set(topic.delivery_layout()) == {topic.parked}


@pytest.mark.parametrize(
    ("namespace", "name", "chroot", "message"),
    [
        ("Shop", "t", "/zeps", "namespace 'Shop' is not a valid name"),
        ("shop", "t/../x", "/zeps", "topic 't/../x' is not a valid name"),
        ("shop", "-t", "/zeps", "topic '-t' is not a valid name"),
        ("shop", "t" * 64, "/zeps", "is not a valid name"),
        ("shop", "t", "zeps", "chroot 'zeps' must be an absolute ZooKeeper path"),
        ("shop", "t", "/zeps/", "must be an absolute"),
    ],
)
def test_bad_names_are_config_errors(namespace: str, name: str, chroot: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TopicPaths.of(namespace, name, chroot=chroot)


@pytest.mark.parametrize("consumer", ["", "a/b", "../x", ".hidden", "x" * 129])
def test_bad_consumer_ids(consumer: str) -> None:
    with pytest.raises(ConfigError, match="member id"):
        TopicPaths.of("shop", "t").queue(consumer)


def test_options_defaults_and_errors_name_the_field() -> None:
    assert TopicOptions().max_queue_depth == 10_000
    with pytest.raises(ConfigError, match="max_queue_depth: Input should be greater than or equal to 1"):
        TopicOptions.make(max_queue_depth=0)
    with pytest.raises(ConfigError, match="full_queue_policy: Input should be 'block', 'drop-oldest' or 'fail'"):
        TopicOptions.make(full_queue_policy="sometimes")
    with pytest.raises(ConfigError, match="max_transaction_bytes"):
        TopicOptions.make(max_transaction_bytes=2_000_000)
    with pytest.raises(ConfigError, match="colour: Extra inputs are not permitted"):
        TopicOptions.make(colour="blue")


def test_the_api_coordinates_are_written_once() -> None:
    """The CRDs' group, version and plurals live in zeps.resources; no other module of the SDK or the
    operator spells them (a second spelling is how a rename half-happens)."""
    root = Path(__file__).resolve().parents[2]
    spelled = re.compile(r"""["'](zeps\.dev|v1alpha1|topics|queues|zepsstreams)["']""")
    found = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for tree in ("sdk/zeps", "operator/zeps_operator")
        for path in sorted((root / tree).rglob("*.py"))
        if path.name != "resources.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if spelled.search(line)
    ]
    assert not found, "\n".join(found)


def test_node_names_are_made_and_read_in_one_place() -> None:
    """zeps.paths makes every node name the recipes create and reads them back (a sequence that
    ZooKeeper appends is 10 digits)."""
    queue = QueuePaths.of("shop", "jobs")
    item = queue.item_prefix(7, "w1.3").rsplit("/", 1)[1] + "0000000042"
    assert item == "i-007-w1.3-0000000042" and queue.item_order(item) == (7, 42)
    assert queue.item_order("foreign") == (999, 0)  # a node zeps did not make sorts last
    message = TopicPaths.message_name(12, "m1") + "0000000005"
    assert TopicPaths.message_count(message) == 12 and sequence_of(message) == 5
    assert TopicPaths.message_count("plain-0000000001") == 1  # a node of the zkms format holds one
    assert TopicPaths.of("shop", "cache").parked_for("c1") == "/zeps/shop/topics/cache/parked/c1"


@pytest.mark.parametrize("kind", ["Topic", "Queue", "ZepsStream"])
def test_the_chroot_is_recovered_from_a_resource_path(kind: str) -> None:
    root = paths_of(kind, "shop", "orders", chroot="/prod/zeps").root
    assert chroot_of(kind, "shop", "orders", root) == "/prod/zeps"
    assert chroot_of(kind, "shop", "other", root) is None
    assert chroot_of(kind, "shop", "orders", "") is None


def test_a_partition_of_a_stream_has_its_own_brokers_and_replication_beside_the_streams_spec() -> None:
    stream = StreamPaths.of("shop", "prices")
    assert StreamPaths.of("shop", "prices", partition=0) == stream  # a stream of one partition: as before
    two = StreamPaths.of("shop", "prices", partition=2)
    assert two.root == "/zeps/shop/streams/prices/partitions/2" and two.partition == 2
    assert two.brokers.members == "/zeps/shop/streams/prices/partitions/2/brokers"
    assert two.brokers.manifest == "/zeps/shop/streams/prices/partitions/2/manifest"
    assert two.replication_state == "/zeps/shop/streams/prices/partitions/2/replication/state"
    assert two.spec == stream.spec == "/zeps/shop/streams/prices/spec"
    assert two.of_partition(0) == stream and two.of_partition(1) == stream.of_partition(1)
    with pytest.raises(ConfigError, match=r"partition 256 is out of range"):
        stream.of_partition(256)
