"""A small fallback corpus written for this project (our own words, free to commit).

Used when the package registry cannot be reached and in fast unit tests. Difficulty is our own judgement on
[0, 1], spread evenly so that the outcome model's calibration sees a realistic range.
"""

from __future__ import annotations

# (id, domain, difficulty, text)
EMBEDDED_TASKS: tuple[tuple[str, str, float, str], ...] = (
    (
        "emb/code/01",
        "code",
        0.05,
        "Write a Python function `count_vowels(s: str) -> int` that returns how many characters of `s` are "
        "vowels (a, e, i, o, u, either case).",
    ),
    (
        "emb/code/02",
        "code",
        0.10,
        "Write `second_largest(xs: list[int]) -> int | None` returning the second largest distinct value in "
        "the list, or None when there is no such value.",
    ),
    (
        "emb/code/03",
        "code",
        0.15,
        "Implement `is_balanced(s: str) -> bool` that checks whether every bracket among ()[]{} in `s` is "
        "closed in the right order. Other characters are ignored.",
    ),
    (
        "emb/code/04",
        "code",
        0.20,
        "Given a list of meeting intervals [start, end), write `merge(intervals)` that merges overlapping "
        "ones and returns them sorted by start.",
    ),
    (
        "emb/code/05",
        "code",
        0.25,
        "Write `run_length(s: str) -> str` that compresses runs of equal characters as char followed by "
        "count, e.g. 'aaabcc' becomes 'a3b1c2'. Also write the inverse function.",
    ),
    (
        "emb/code/06",
        "code",
        0.32,
        "A robot starts at (0, 0) facing north and reads a command string of 'L', 'R' and 'F'. Return the "
        "Manhattan distance from the origin after all commands, and whether it ever revisits a cell.",
    ),
    (
        "emb/code/07",
        "code",
        0.38,
        "Implement an LRU cache class with `get(key)` and `put(key, value)` in O(1) time and a fixed "
        "capacity given to the constructor.",
    ),
    (
        "emb/code/08",
        "code",
        0.45,
        "Read N lines, each a word. Group the words that are anagrams of each other and print each group on "
        "one line, groups ordered by their first appearance.",
    ),
    (
        "emb/code/09",
        "code",
        0.52,
        "Given a grid of '0' (water) and '1' (land), count the islands, where land cells connect "
        "horizontally or vertically. The grid can be up to 1000 by 1000.",
    ),
    (
        "emb/code/10",
        "code",
        0.58,
        "Given an array of positive integers and a target T, return the length of the shortest contiguous "
        "subarray whose sum is at least T, or 0 if none exists. Aim for linear time.",
    ),
    (
        "emb/code/11",
        "code",
        0.65,
        "Find the minimum number of coins needed to make amount A from unlimited coins of the given "
        "denominations; print -1 if impossible. A is at most 10^5 and there are at most 100 denominations.",
    ),
    (
        "emb/code/12",
        "code",
        0.72,
        "A weighted directed graph has up to 10^5 nodes and 2*10^5 edges with non-negative weights. Print "
        "the shortest distance from node 1 to every node, or -1 for unreachable nodes.",
    ),
    (
        "emb/code/13",
        "code",
        0.80,
        "Given a string of up to 2*10^5 lowercase letters, answer Q queries: how many distinct substrings "
        "does the substring s[l..r] contain? Q is at most 100 and each query range is at most 2000 long.",
    ),
    (
        "emb/code/14",
        "code",
        0.88,
        "Place N queens on an N by N board with some cells blocked so that no two attack each other; count "
        "the placements modulo 10^9+7 for N up to 14.",
    ),
    (
        "emb/code/15",
        "code",
        0.95,
        "You are given a tree of up to 2*10^5 vertices with values. Support updates of one value and queries "
        "for the maximum value on the path between two vertices, all online.",
    ),
    (
        "emb/math/01",
        "math",
        0.05,
        "A shop sells pencils at 3 for 45 cents. How much do 12 pencils cost, in dollars?",
    ),
    ("emb/math/02", "math", 0.10, "Solve for x: 5x - 7 = 2x + 11."),
    (
        "emb/math/03",
        "math",
        0.16,
        "A rectangle's length is twice its width and its perimeter is 54 cm. What is its area in square "
        "centimetres?",
    ),
    (
        "emb/math/04",
        "math",
        0.22,
        "Two fair six-sided dice are rolled. What is the probability that the sum is a prime number? Give "
        "the answer as a fraction in lowest terms.",
    ),
    ("emb/math/05", "math", 0.28, "What is the remainder when 7^100 is divided by 5?"),
    ("emb/math/06", "math", 0.35, "How many positive divisors does 360 have?"),
    (
        "emb/math/07",
        "math",
        0.42,
        "The sum of an infinite geometric series is 12 and its first term is 4. What is the sum of the "
        "squares of its terms?",
    ),
    (
        "emb/math/08",
        "math",
        0.48,
        "In how many ways can the letters of the word BANANA be arranged so that no two A's are adjacent?",
    ),
    ("emb/math/09", "math", 0.55, "Find all real x such that sqrt(x + 7) - sqrt(x) = 1."),
    (
        "emb/math/10",
        "math",
        0.62,
        "A point is chosen uniformly inside a square of side 2. What is the probability that it lies within "
        "distance 1 of the square's centre? Express the answer in terms of pi.",
    ),
    (
        "emb/math/11",
        "math",
        0.68,
        "Let f(x) = x^2 + bx + c have roots r and s with r + s = 6 and r^2 + s^2 = 20. Find f(1).",
    ),
    (
        "emb/math/12",
        "math",
        0.75,
        "How many ordered triples of positive integers (a, b, c) satisfy a + b + c = 20 with a < b < c?",
    ),
    (
        "emb/math/13",
        "math",
        0.82,
        "Find the number of integers n between 1 and 1000 for which n^2 + n + 41 is divisible by 43.",
    ),
    (
        "emb/math/14",
        "math",
        0.89,
        "Triangle ABC has sides 13, 14 and 15. Find the distance between the centre of its inscribed circle "
        "and the centre of its circumscribed circle.",
    ),
    (
        "emb/math/15",
        "math",
        0.95,
        "Find the smallest positive integer N such that N, N+1 and N+2 each have exactly four positive "
        "divisors.",
    ),
)
