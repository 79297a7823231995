-- The end of `release.lua`, after the helpers: the lock was deleted and clients wait (or an
-- earlier version's flag is there): the one that has waited longest is named, and handed the
-- lock when a claim is given.
name_next(KEYS[2], ARGV[2], KEYS[1], KEYS[3], ARGV[3])
return 1
