-- wrk script for bench/run.py: POST a mix of AdmissionReviews, one per line
-- of the file given after "--", over keep-alive connections, and print the
-- figures bench/run.py reads as one JSON line.

local bodies = {}
local next_body = 1
local headers = {["Content-Type"] = "application/json"}

function init(args)
  for line in io.lines(args[1]) do
    bodies[#bodies + 1] = line
  end
  -- Threads start at different places in the mix.
  next_body = (tonumber(args[2] or "0") % #bodies) + 1
end

function request()
  local body = bodies[next_body]
  next_body = next_body % #bodies + 1
  return wrk.format("POST", "/mutate", headers, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "errors": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout))
end
