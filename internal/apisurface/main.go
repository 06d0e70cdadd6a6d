// Command apisurface prints how many exported identifiers a user of a
// package must read: its exported types, funcs, methods (those of the
// types its aliases name included), consts and vars, each counted once (a
// const block's names one by one); the methods of its exported interfaces
// are counted apart. Struct fields are not counted. Names listed with
// -exclude (a type and everything it declares) are left out: the root
// package's store contract (KeyStore) is for store authors, not users.
//
//	go run ./internal/apisurface -exclude KeyStore . ./idemhttp ./backend
//	go run ./internal/apisurface -v .     # lists the names too
//
// The limits the project keeps are checked by this package's test.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

func main() {
	verbose := flag.Bool("v", false, "list the names counted")
	exclude := flag.String("exclude", "", "comma-separated types left out with their methods")
	flag.Parse()
	var skip []string
	if *exclude != "" {
		skip = strings.Split(*exclude, ",")
	}
	failed := false
	for _, dir := range flag.Args() {
		names, err := Surface(dir, skip...)
		if err != nil {
			fmt.Fprintln(os.Stderr, "apisurface:", err)
			failed = true
			continue
		}
		n, im := Count(names)
		fmt.Printf("%s: %d exported identifiers (and %d methods of its interfaces)\n", dir, n, im)
		if *verbose {
			for _, n := range names {
				fmt.Println("\t" + n)
			}
		}
	}
	if failed {
		os.Exit(1)
	}
}
