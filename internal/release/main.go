// Command release records, tags and checks the versions of this
// repository's published modules.
//
// The modules and their versions are listed in versions.txt beside this
// file, in tagging order (a module after every module it requires). A
// module in directory dir is tagged dir/vX.Y.Z; the root module vX.Y.Z.
//
//	go run -C internal/release . check   # what CI runs
//	go run -C internal/release . tag     # tags HEAD, in order
//
// The check subcommand clones the repository's HEAD into a scratch
// directory and creates the tags there. It builds a module proxy directory
// from them (zips made by golang.org/x/mod/zip). Then, for each module, it
// builds and runs a small consumer program that imports every public
// package of the module. Before that, it fills the local module cache with
// the module's third-party requirements (with the usual GOPROXY). The
// build then uses GOPROXY set to that directory and the local module cache
// (no network), no replace directive and GOFLAGS=-mod=mod. It fails if any module does not
// resolve, build or run, or if a module requires another module of this
// repository at a version other than the recorded one.
package main

import (
	"flag"
	"fmt"
	"os"
)

// root is the module path of the repository's root module.
const root = "github.com/go-idempotency/idempotency"

// release is one published module at its recorded version.
type release struct {
	Dir     string // slash-separated, relative to the repository root; "." for the root
	Path    string // module path
	Version string
}

// Tag is the git tag of r.
func (r release) Tag() string {
	if r.Dir == "." {
		return r.Version
	}
	return r.Dir + "/" + r.Version
}

func main() {
	repo := flag.String("repo", "../..", "the repository's root directory")
	keep := flag.Bool("keep", false, "check: keep the scratch directory and print its path")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: release [-repo DIR] check|tag")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	var err error
	switch flag.Arg(0) {
	case "check":
		err = check(*repo, *keep)
	case "tag":
		err = tag(*repo)
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}
