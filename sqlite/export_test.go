package sqlite

import "github.com/go-idempotency/idempotency"

// JoinedTurn reports how many callers of s have joined the turn of key held
// by another caller of s (see keywait.Queue.Joined).
func JoinedTurn(s *Store, key idempotency.Key) int { return s.keys.Joined(key) }
