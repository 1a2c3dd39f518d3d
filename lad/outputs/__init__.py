"""What finished runs become: the HTML report and the paper's analyses (`ablate`)."""
