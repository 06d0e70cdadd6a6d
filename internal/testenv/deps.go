//go:build pindeps

// This file only pins the backends' drivers in go.mod while their packages
// are being written; it is never built.
package testenv

import (
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"
)
