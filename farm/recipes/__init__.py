"""Stage 3: recipes, the cells they make with the grid, build keys and the plan."""
