-- The fence of every leader write takes the lease row FOR KEY SHARE. Making (name, term) a key
-- makes a takeover (which changes term) a key update: it must wait for every fenced write in
-- flight, as before. A renewal changes only expires_at, a non-key update (FOR NO KEY UPDATE),
-- which KEY SHARE does not block: the leader's own writes can no longer hold up its renewal
-- and make it depose itself under load.
CREATE UNIQUE INDEX chime_leader_name_term ON chime_leader (name, term);
