-- Records the schema version this build writes, unless the store holds a newer one.
-- KEYS: the schema key. ARGV: the version. Returns the version found (nil: none).
local found = redis.call('GET', KEYS[1])
if not found or tonumber(found) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return found
