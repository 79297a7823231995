-- The end of `release.lua`, after the helpers: the lock was deleted and clients wait (or an
-- earlier version's flag is there): the one that has waited longest is named.
name_next(KEYS[2], ARGV[2], KEYS[1])
return 1
