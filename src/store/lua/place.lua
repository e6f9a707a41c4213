-- place: replace the placement if the caller names the stored version (compare-and-set).
-- No generation check: after a data loss, pods put back the placement they remember.
-- KEYS[1] placement
-- ARGV[1] expected version ('' = the store must have none), ARGV[2] new version,
-- ARGV[3] table JSON, ARGV[4] events channel
-- Reply: 1 if stored (and `placement <version>` published), 0 if the version differed.
local current = redis.call('HGET', KEYS[1], 'version')
if (current or '') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'table', ARGV[3])
redis.call('PUBLISH', ARGV[4], 'placement ' .. ARGV[2])
return 1
