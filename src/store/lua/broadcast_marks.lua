-- broadcast_marks: marks and progress of one shard, by its holder
-- (BroadcastState::write_marks).
-- KEYS: 1 lease:<shard>, 2 epochs, 3 broadcast:<id>, 4 broadcast-marks:<id>:<shard>,
--   5 broadcast-progress:<id>
-- ARGV: 1 pod, 2 epoch, 3 shard, 4 keep until ms, 5 progress JSON or '', then pairs of
--   terminal, mark text ('s...' only where the terminal has none; '-s...': removed if
--   the terminal's mark is still 's...', a copy that provably was not taken)
-- Reply: {'not_holder'} | {'done', kept...} (per pair: the mark kept instead, or '')
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('HGET', KEYS[2], ARGV[3]) ~= ARGV[2] then
  return {'not_holder'}
end
local reply = {'done'}
local gone = redis.call('EXISTS', KEYS[3]) == 0
for i = 6, #ARGV, 2 do
  local terminal, mark = ARGV[i], ARGV[i + 1]
  local kept = ''
  if not gone then
    if string.sub(mark, 1, 1) == '-' then
      if redis.call('HGET', KEYS[4], terminal) == string.sub(mark, 2) then
        redis.call('HDEL', KEYS[4], terminal)
      end
    elseif string.sub(mark, 1, 1) == 's' then
      if redis.call('HSETNX', KEYS[4], terminal, mark) == 0 then
        kept = redis.call('HGET', KEYS[4], terminal)
      end
    else
      redis.call('HSET', KEYS[4], terminal, mark)
    end
  end
  reply[#reply + 1] = kept
end
if not gone then
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[5], ARGV[3], ARGV[5])
    redis.call('PEXPIREAT', KEYS[5], ARGV[4])
  end
  if redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('PEXPIREAT', KEYS[4], ARGV[4])
  end
end
return reply
