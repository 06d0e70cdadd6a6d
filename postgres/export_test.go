package postgres

import "github.com/jackc/pgx/v5"

// Backend is what the store learnt about conn: "direct", "pooled", or ""
// before its first reservation.
func Backend(conn *pgx.Conn) string {
	switch conn.PgConn().CustomData()[backendKey] {
	case backendDirect:
		return "direct"
	case backendPooled:
		return "pooled"
	}
	return ""
}
