"""The limiter adapter: concurrency permits as Redis semaphores (see ``limiter.lua``)."""

from conveyor.limiter.heartbeat import LeaseKeeper
from conveyor.limiter.redis import RedisLimiter

__all__ = ["LeaseKeeper", "RedisLimiter"]
