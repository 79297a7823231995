-- How long a fencing counter is kept after its lock was freed with nobody waiting: a lock
-- taken again within that time counts on (one `INCR`); after it the counter is gone and the
-- next take seeds it from the server's clock again, as after a restart.
local IDLE_FENCE_MS = 60000
