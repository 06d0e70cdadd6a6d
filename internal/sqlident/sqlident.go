// Package sqlident checks the table names the SQL stores put into their
// statements. They must be plain identifiers that need no quoting on any
// of PostgreSQL, MySQL/MariaDB and SQLite. So a name from configuration
// can never inject SQL.
package sqlident

import "fmt"

// Check reports why name is not a plain identifier of 1 to maxLen bytes
// (ASCII letters, digits and underscores, not starting with a digit), or nil
// if it is one.
func Check(name string, maxLen int) error {
	switch {
	case name == "":
		return fmt.Errorf("is empty")
	case len(name) > maxLen:
		return fmt.Errorf("is longer than %d bytes", maxLen)
	case name[0] >= '0' && name[0] <= '9':
		return fmt.Errorf("starts with a digit")
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return fmt.Errorf("has %q: want ASCII letters, digits and underscores", c)
		}
	}
	return nil
}
