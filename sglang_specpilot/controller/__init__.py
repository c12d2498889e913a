"""Searches judged by measurement: the co-location plan search (MCTS over joint plans) and its proposers."""
