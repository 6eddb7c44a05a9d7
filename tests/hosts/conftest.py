"""Fixtures of the host tests: a host set made for one test and removed after it."""
import pytest

from host_helpers import remove_set
from kosmoss.launch import hosts


@pytest.fixture
def made_hosts(request):
    """make(count, rate) -> a HostSet owned by nobody (as `kosmoss hosts up`), removed at
    the end of the test whatever happened."""
    made = []

    def make(count=2, rate=None):
        found = hosts.make_hosts(count, rate, purpose="test", owner=None)
        made.append(found.set_id)
        return found

    yield make
    for set_id in made:
        remove_set(set_id)
