package outbox

// MakeRelayGreedy breaks r's fairness on purpose (a store keeps its slot for its next claim
// while others wait), so that a test can show the fairness test catches it.
func MakeRelayGreedy(r *Relay) { r.sched.greedy = true }
