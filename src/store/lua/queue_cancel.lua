-- queue_cancel: cancels one queued push of a tenant, or all of them to a terminal
-- (QueueState::cancel). Pushes that may be on their way (sending) are left.
-- KEYS: 1 queue-usage, 2 queue:<t>, 3 bodies:<t>, 4 order:<t>, 5 collapse:<t>,
--   6 waiting:<shard>, 7 done:<tenant>, 8 drops:<tenant>, 9 feed:<tenant>
-- ARGV: 1 tenant, 2 id ('' for all), 3 now ms, 4 retention ms, 5 charge per record,
--   6 drops per call, 7 feed length
-- Reply: {{cancelled key...}, {JSON of each push left...}}
local k = {u = KEYS[1], t = KEYS[2], b = KEYS[3], o = KEYS[4], c = KEYS[5], s = KEYS[6],
  d = KEYS[7], r = KEYS[8], f = KEYS[9]}
local tenant, now, per_record = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[5])
gc(k, tenant, now, tonumber(ARGV[6]), per_record)
local cancelled, left = {}, {}
local ids = {ARGV[2]}
if ARGV[2] == '' then
  ids = redis.call('ZRANGE', k.o, 0, -1)
end
for _, id in ipairs(ids) do
  local json = redis.call('HGET', k.t, id)
  if json then
    local rec = cjson.decode(json)
    if rec.tenant == tenant then
      if rec.state == 'queued' then
        local key = rec.key
        finish(k, id, rec, finished(rec, 'cancelled', now), now + tonumber(ARGV[4]),
          per_record, tonumber(ARGV[7]))
        cancelled[#cancelled + 1] = key
      else
        left[#left + 1] = json
      end
    end
  end
end
return {cancelled, left}
